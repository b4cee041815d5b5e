# The version line of Ascend/MindSpeed setup.py, branch 2.3.0_core_r0.12.1 at 674226a15a8214cc0c78f986b0b89fbe6b879ba1
__version__ = '0.12.1'
