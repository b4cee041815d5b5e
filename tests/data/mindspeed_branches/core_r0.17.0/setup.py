# The version line of Ascend/MindSpeed setup.py, branch core_r0.17.0 at 1f5feb86da9e6ccc6f8e981f5f0ac655a2d00ae5
__version__ = '0.12.1'
