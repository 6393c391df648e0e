"""With PROCESS_CENSUS=FILE and this folder on PYTHONPATH, every Python interpreter that starts appends one line to
FILE at its exit: its first arguments, its own CPU seconds and whether it imported torch and fairseq
(tests/suite_times.py --census reads them). A process killed or ended by os._exit writes nothing. Without the
variable it does nothing."""
import os

if os.environ.get("PROCESS_CENSUS"):
    import atexit
    import json
    import resource
    import sys

    def _record(path=os.environ["PROCESS_CENSUS"]):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        line = json.dumps({"argv": sys.argv[:3], "cpu": round(usage.ru_utime + usage.ru_stime, 3),
                           "torch": "torch" in sys.modules, "fairseq": "fairseq" in sys.modules}) + "\n"
        with open(path, "a", encoding="utf-8") as f:  # one short append: whole lines even with many writers
            f.write(line)

    atexit.register(_record)
