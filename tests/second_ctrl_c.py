"""A process that gets a second Ctrl-C while a graceful stop is pending, the second landing
inside a logging call (whose lock a raised KeyboardInterrupt would leave half-released): the
script the training signal tests and the fault matrix run in a real subprocess."""
from __future__ import annotations

import textwrap

SCRIPT = textwrap.dedent("""
    import logging, os, signal, sys
    from megatron_biglm.training.signals import GracefulStop

    class SecondCtrlCWhileLogging(logging.Handler):
        def emit(self, record):  # runs with logging's handler lock held
            os.kill(os.getpid(), signal.SIGINT)

    log = logging.getLogger("run")
    log.addHandler(SecondCtrlCWhileLogging())
    log.setLevel(logging.INFO)
    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGINT)  # the first: the stop is now pending
        assert stop.should_stop()
        print("first Ctrl-C recorded", flush=True)
        log.info("saving the checkpoint")   # the second arrives in here
        print("still running after the second Ctrl-C", flush=True)
""")
