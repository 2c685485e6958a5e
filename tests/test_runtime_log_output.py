"""flax_transformer.runtime.log_output: after `silence`, the line a failing job prints last stays
last, although another thread is writing a log record at that moment (train.py's error line and
the data pipeline's threads)."""

import subprocess
import sys
import textwrap

import pytest

# A process as train.py's: absl's flags parsed, INFO on. Its data thread's record is held right
# past the level check (in a filter of absl's handler) while the main thread ends the log output
# with STOP and prints its error line; then the record goes on, and the thread logs once more.
SCRIPT = textwrap.dedent("""
    import sys, threading
    from absl import flags, logging
    from flax_transformer.runtime import log_output

    flags.FLAGS(["train.py"])
    logging.use_absl_handler()  # What absl's app.run does.
    logging.set_verbosity(logging.INFO)
    on_its_way, go_on = threading.Event(), threading.Event()

    def hold(record):
      if record.getMessage() == "a data thread's record":
        on_its_way.set()
        go_on.wait()
      return True

    logging.get_absl_handler().addFilter(hold)
    logging.info("before the error")

    def data_thread():
      logging.info("a data thread's record")
      logging.error("a data thread's next record")  # Passes ERROR verbosity.

    thread = threading.Thread(target=data_thread)
    thread.start()
    on_its_way.wait()
    STOP
    sys.stderr.write("error: the one line\\n")
    sys.stderr.flush()
    go_on.set()
    thread.join()
    """)


@pytest.mark.parametrize("stop, last", [
    ("log_output.silence()", "error: the one line"),
    # The control, what train.py did before: the record on its way is written after the error.
    ("logging.set_verbosity(logging.ERROR)", "a data thread's next record"),
])
def test_the_error_line_stays_last(stop, last):
  result = subprocess.run([sys.executable, "-c", SCRIPT.replace("STOP", stop)],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  lines = result.stderr.strip().splitlines()
  assert "before the error" in lines[0], lines
  assert lines[-1].endswith(last), lines
  assert ("a data thread's record" in result.stderr) == (stop != "log_output.silence()")
