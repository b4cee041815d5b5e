# The version line of Ascend/MindSpeed setup.py, branch core_r0.16.0 at e4772499f7eb9fa9a68919dd1eaddef00e915b2d
__version__ = '0.16.0'
