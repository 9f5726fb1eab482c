"""The end-to-end fine-tune that confirms a study's winners: the run (run), its configuration and
files (config), its data (data).
"""
