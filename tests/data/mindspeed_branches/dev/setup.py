# The version line of Ascend/MindSpeed setup.py, branch dev at 8258d36ff002f7a41add46c2b0dc7bcfc238e58d
__version__ = '0.14.1'
