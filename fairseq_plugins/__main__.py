"""The table of position schemes for shell scripts (``fairseq_plugins/schemes.py``)::

    python -m fairseq_plugins models              # every scheme's model name, one line
    python -m fairseq_plugins archs [SIZE]        # the architecture of every scheme that has its own, one line
    python -m fairseq_plugins arch NAME... [--size SIZE]   # per name, one line: its architecture and flags
"""
import sys

from .schemes import MODELS, SCHEMES, arch_and_flags

USAGE = "usage: python -m fairseq_plugins models | archs [SIZE] | arch NAME... [--size SIZE]"


def main(argv):
    try:
        if argv == ["models"]:
            print(" ".join(MODELS))
        elif argv[:1] == ["archs"] and len(argv) <= 2:
            print(" ".join(s.arch(*argv[1:]) for s in SCHEMES.values() if s.arch_prefix))
        elif argv[:1] == ["arch"] and len(argv) >= 2:
            names, size = argv[1:], "tiny"  # a model name (rope) or a table arch (rope_transformer_tiny)
            if "--size" in names:
                i = names.index("--size")
                if i + 2 != len(names):
                    raise ValueError(USAGE)
                names, size = names[:i], names[i + 1]
            lines = [" ".join(arch_and_flags(name, size)) for name in names]  # all checked before any is printed
            print("\n".join(lines))
        else:
            raise ValueError(USAGE)
    except ValueError as err:
        sys.exit(f"fairseq_plugins: {err}")


if __name__ == "__main__":
    main(sys.argv[1:])
