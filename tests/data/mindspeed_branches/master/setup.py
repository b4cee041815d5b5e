# The version line of Ascend/MindSpeed setup.py, branch master at 028de58ca629d035185b00ff7d1eb7eff4f7fd48
__version__ = '0.12.1'
