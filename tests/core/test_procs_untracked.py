"""A local run's stop also takes a child whose start a signal cut short (started, not recorded)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def test_untracked_children_are_stopped_and_tracked_ones_left_alone() -> None:
    # In a process of its own: the test process's other children (the session's servers) are not ours to stop.
    script = textwrap.dedent("""
        import json, os, subprocess
        from sharetune.procs import stop_untracked_children
        sleep = ["sleep", "60"]
        stray = subprocess.Popen(sleep, start_new_session=True)    # started, never recorded
        kept = subprocess.Popen(sleep, start_new_session=True)     # recorded
        same_group = subprocess.Popen(sleep)                        # not a group of its own: not ours to stop
        stopped = stop_untracked_children({kept.pid})
        gone = not os.path.exists(f"/proc/{stray.pid}")
        print(json.dumps({"stopped": stopped, "stray": stray.pid, "stray_gone": gone,
                          "kept_alive": kept.poll() is None, "same_group_alive": same_group.poll() is None}))
        kept.kill(); same_group.kill()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["stopped"] == [r["stray"]] and r["stray_gone"]  # killed and reaped
    assert r["kept_alive"] and r["same_group_alive"]
