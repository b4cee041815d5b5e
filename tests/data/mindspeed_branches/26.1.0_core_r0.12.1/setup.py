# The version line of Ascend/MindSpeed setup.py, branch 26.1.0_core_r0.12.1 at 57a33053c4eccd5b14aa58e3ca595ab414e65b94
__version__ = '0.12.1'
