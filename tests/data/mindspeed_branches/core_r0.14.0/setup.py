# The version line of Ascend/MindSpeed setup.py, branch core_r0.14.0 at 71b9e055b2183f5e0247c2e9d869f7c4890bdb45
__version__ = '0.14.1'
