"""Local mode (``sharetune run JOB.yaml --local``): a TuningJob's topology as plain processes on
this machine, with no cluster. The tracker, the servers (and the MPS daemon of a cuda job), one
client per shard and the merge are the tuner's own commands, the ones the operator's pods run
(``sharetune.api.commands``), each started as a child process (``python -m sharetune_tuner.cli``);
the rules applied to their exits are the operator's (``sharetune.driver``). Several jobs at once
share this machine's GPUs through the operator's share ledger (``sharetune.admission``).
Nothing here imports the tuner runtime: its processes are reached through their command lines.
"""
