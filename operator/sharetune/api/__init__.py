"""The TuningJob contract: what the operator, the tuner pods and local mode agree on.

The bottom floor: imports nothing else of sharetune or sharetune_tuner (checked by the import
contracts in ``devtools/importlinter.ini``), and nothing outside the standard library and PyYAML.
"""
