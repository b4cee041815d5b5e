# The version line of Ascend/MindSpeed setup.py, branch core_r0.18.0 at 4213c91313fe4de6da12794109515f6275572750
__version__ = '0.12.1'
