# The version line of Ascend/MindSpeed setup.py, branch 26.0.0_core_r0.12.1 at 3c44c134f396fc14a22a38934c7d5d8bedb37ff5
__version__ = '0.12.1'
