# The version line of Ascend/MindSpeed setup.py, branch core_r0.15.3 at d0d5809d4323eb908f89e87958de254465eb57b4
__version__ = '0.15.3'
