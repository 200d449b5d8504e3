"""The stuck-loop report (engine/stall.py) names the user's code that does not return, not the
standard library's function the sample happened to land in: session 26's CI caught the report of a
local step polling a file as ``at <frozen genericpath>:19 (exists)`` instead of ``(hold_until)``."""

from __future__ import annotations

import sys
import threading
import time

from weft_django.engine import stall


def _user_code_waiting(event: threading.Event) -> None:
    event.wait(30)  # threading.py's Condition.wait: the innermost frame is the standard library's


def test_a_call_stuck_inside_the_standard_library_is_reported_at_the_user_code_that_made_it() -> None:
    event = threading.Event()
    thread = threading.Thread(target=_user_code_waiting, args=(event,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while True:
            frame = sys._current_frames().get(thread.ident or 0)
            if frame is not None and frame.f_code.co_name == "wait" and "threading" in frame.f_code.co_filename:
                break
            assert time.monotonic() < deadline, "the thread never waited"
            time.sleep(0.01)
        where = stall._where(frame)
    finally:
        event.set()
        thread.join(5)
    assert where.endswith("(_user_code_waiting)"), where
    assert __file__.removesuffix("c") in where or "test_stall_where.py" in where


def test_a_frame_of_user_code_is_reported_as_it_is() -> None:
    frame = sys._getframe()
    assert stall._where(frame).endswith("(test_a_frame_of_user_code_is_reported_as_it_is)")
