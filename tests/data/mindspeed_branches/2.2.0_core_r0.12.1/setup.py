# The version line of Ascend/MindSpeed setup.py, branch 2.2.0_core_r0.12.1 at a654440c14159a68c8a7f1e1665a89bdec8e74f0
__version__ = '0.12.1'
