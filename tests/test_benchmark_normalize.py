"""What the domain-notebook harness leaves out when it compares outputs (`benchmarks.run`)."""

from __future__ import annotations

from benchmarks.run import strip_log_records

RECORD = (
    "2026-12-07 08:57:01,123 - distributed.worker - ERROR - Failed to communicate with scheduler during heartbeat.\n"
    "Traceback (most recent call last):\n"
    '  File "/site-packages/distributed/comm/tcp.py", line 226, in read\n'
    "    frames_nosplit_nbytes_bin = await stream.read_bytes(fmt_size)\n"
    "tornado.iostream.StreamClosedError: Stream is closed\n"
    "\n"
    "The above exception was the direct cause of the following exception:\n"
    "\n"
    "Traceback (most recent call last):\n"
    '  File "/site-packages/distributed/worker.py", line 1250, in heartbeat\n'
    "distributed.comm.core.CommClosedError: in <TCP (closed)>: Stream is closed\n"
)


def test_a_library_log_record_goes_with_its_traceback() -> None:
    assert strip_log_records(RECORD) == ""
    assert strip_log_records("NBRewind: replayed from cell run #3\n" + RECORD) == ""


def test_what_the_notebook_wrote_to_stderr_stays() -> None:
    own = "Traceback (most recent call last):\n  File \"<cell>\", line 1\nValueError: bad input\n"
    assert strip_log_records(own) == own  # no log header before it: the notebook's own
    after = "a warning the notebook printed\n"
    assert strip_log_records(RECORD + after) == after
    assert strip_log_records(after + RECORD) == after
