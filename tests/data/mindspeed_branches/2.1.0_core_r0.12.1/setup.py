# The version line of Ascend/MindSpeed setup.py, branch 2.1.0_core_r0.12.1 at 5a9ee296b4d80991c53f9ee16738788550e5cc08
__version__ = '0.12.1'
