"""The process group dies before interpreter exit, not in it.

A finished worker once aborted with "terminate called without an active exception"
(exit -6) after its final snapshot: the DDP wrapper, held in reference cycles, kept
the gloo group alive past destroy_process_group() until interpreter finalization,
where a gloo thread that needs the GIL is ended by CPython and std::terminate runs.
"""
import subprocess
import sys
import textwrap

from ddpjob_sandbox.procs import free_port

# Runs the example to its end in one process with automatic collection off (so only
# ddpjob's own collection can free the cycles); the first atexit handler runs last
# (LIFO), after the one distributed() registers, and reports the DDP wrappers left.
WORKER = textwrap.dedent("""
    import atexit, gc, sys
    def left():
        count = sum(type(o).__name__ == "DistributedDataParallel" for o in gc.get_objects())
        print(f"ddp left at exit: {count}", flush=True)
    atexit.register(left)
    gc.disable()
    from ddpjob_trainer.examples import mlp
    mlp.main(["--epochs", "1", "--samples", "64", "--val-samples", "0", "--no-progress-bar",
              "--snapshot-dir", sys.argv[1]])
    count = sum(type(o).__name__ == "DistributedDataParallel" for o in gc.get_objects())
    print(f"ddp left after main: {count}", flush=True)
""")


def run_worker(tmp_path) -> str:
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", WORKER, str(tmp_path / "snap")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_ddp_wrapper_and_its_group_are_freed_before_interpreter_finalization(tmp_path):
    out = run_worker(tmp_path)
    # After main returns the Trainer/DDP cycle is garbage that only a collection frees:
    # the one distributed() registered at exit does, while the interpreter is whole.
    assert "ddp left after main: 1" in out, out
    assert "ddp left at exit: 0" in out, out
