"""A miniature copy of the statmt.org WMT14 downloads: the same archive names and member paths as the real
ones (training-parallel-*.tgz, training-giga-fren.tar with gzipped members, dev.tgz and test-full.tgz with
SGML newstest files), holding a few hundred synthetic sentence pairs, plus pairs that cleaning must drop
or repair. Used by tests/test_wmt_pipeline.py through scripts/prepare_wmt14.sh --from."""
import gzip
import hashlib
import io
import random
import tarfile
from pathlib import Path

WORDS = ("haus katze hund baum auto stadt fluss berg see wald feld weg tisch stuhl buch brief zug schiff "
         "vogel fisch blume stern mond sonne regen wind schnee licht nacht tag").split()

# pairs that scripts/wmt14_data.py clean must drop (clean-corpus-n.perl -ratio 1.5, 1..250 tokens)
DROPPED = [
    ("", "leer"),  # empty source
    ("only one side", ""),  # empty target
    ("a b c d e f g h", "a b"),  # ratio 4 > 1.5
    ("x " * 251, "y " * 251),  # more than 250 tokens
    ("\u200b \t", "nothing printable"),  # empty after normalisation
]
# pairs it must keep, normalised: (raw source, raw target, expected source, expected target)
REPAIRED = [
    ("  leading and   inner  spaces ", "führende und  innere\tLeerzeichen", "leading and inner spaces",
     "führende und innere Leerzeichen"),
    ("zero\u200bwidth soft\u00adhyphen", "null\u200bbreite weich\u00adtrenner", "zero width soft hyphen",
     "null breite weich trenner"),
    ("no\u00a0break space\x07bell", "ohne\u00a0umbruch\x07glocke", "no break space bell", "ohne umbruch glocke"),
]


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def corpus(seed, n):
    """n clean synthetic pairs (the target a reversed, capitalised source: any mapping will do here)."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        src = sentence(rng, rng.randint(3, 15))
        pairs.append((src, " ".join(w.capitalize() for w in reversed(src.split()))))
    return pairs


def sgm(kind, setid, lang, lines):
    """A WMT 'fake SGML' file: one <seg> per line inside docs (kind: srcset or refset)."""
    out = [f'<{kind} setid="{setid}" srclang="any" trglang="{lang}">']
    for d in range(0, len(lines), 7):
        out.append(f'<doc sysid="ref" docid="doc{d}" genre="news" origlang="en">')
        out.append("<p>")
        out += [f'<seg id="{i + 1}">{line}</seg>' for i, line in enumerate(lines[d:d + 7], d)]
        out += ["</p>", "</doc>"]
    out.append(f"</{kind}>")
    return "\n".join(out) + "\n"


def _add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_archive(path, members, compress=True):
    with tarfile.open(path, "w:gz" if compress else "w") as tar:
        for name, text in members.items():
            data = text if isinstance(text, bytes) else text.encode("utf-8")
            _add(tar, name, data)


def side(pairs, i):
    return "".join(p[i] + "\n" for p in pairs)


def build_mirror(root, n_train=120, n_dev=40, n_test=50, test_lines=None):
    """Writes the seven archives into root; returns what prepare_wmt14.sh should produce:
    {'train': {pair: [(src, tgt), ...]}, 'valid': {...}, 'test': {...}} (expected raw/ contents)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    expected = {"train": {"en-de": [], "en-fr": []}, "valid": {}, "test": {}}
    archives = {"training-parallel-europarl-v7.tgz": {}, "training-parallel-commoncrawl.tgz": {},
                "training-parallel-nc-v9.tgz": {}, "training-parallel-un.tgz": {}, "training-giga-fren.tar": {}}
    plan = [  # (archive, member prefix, pairs' languages)
        ("training-parallel-europarl-v7.tgz", "training/europarl-v7.{x}-en", ("de", "fr")),
        ("training-parallel-commoncrawl.tgz", "commoncrawl.{x}-en", ("de", "fr")),
        ("training-parallel-un.tgz", "un/undoc.2000.fr-en", ("fr",)),
        ("training-parallel-nc-v9.tgz", "training/news-commentary-v9.{x}-en", ("de", "fr")),
    ]
    seed = 0
    for archive, prefix, langs in plan:
        for x in langs:
            seed += 1
            good = corpus(seed, n_train)
            raw = good + [(s, t) for s, t in DROPPED] + [(s, t) for s, t, _, _ in REPAIRED]
            kept = good + [(es, et) for _, _, es, et in REPAIRED]
            name = prefix.format(x=x)
            archives[archive][f"{name}.en"] = side(raw, 0)
            archives[archive][f"{name}.{x}"] = side(raw, 1)
            expected["train"][f"en-{x}"] += kept
    giga = corpus(99, n_train)  # giga-fren: gzipped files inside a plain tar
    archives["training-giga-fren.tar"] = {"giga-fren.release2.fixed.en.gz": gzip.compress(side(giga, 0).encode()),
                                          "giga-fren.release2.fixed.fr.gz": gzip.compress(side(giga, 1).encode())}
    expected["train"]["en-fr"] += giga

    dev, test = corpus(7, n_dev), corpus(8, n_test)
    test_src = [s for s, _ in test]
    test_ref = {x: list(test_lines) if test_lines else [t + (" & co" if i % 5 == 0 else "") for i, (_, t) in enumerate(test)]
                for x in ("de", "fr")}
    if test_lines:
        test_src = [f"source {i}" for i in range(len(test_lines))]
    dev_members = {"dev/newstest2013-src.en.sgm": sgm("srcset", "newstest2013", "en", [f"  {s} " for s, _ in dev])}
    test_members = {}
    for x in ("de", "fr"):
        dev_members[f"dev/newstest2013-ref.{x}.sgm"] = sgm("refset", "newstest2013", x, [t for _, t in dev])
        test_members[f"test-full/newstest2014-{x}en-src.en.sgm"] = sgm("srcset", "newstest2014", "en", test_src)
        test_members[f"test-full/newstest2014-{x}en-ref.{x}.sgm"] = sgm("refset", "newstest2014", x, test_ref[x])
        expected["valid"][f"en-{x}"] = [(s, t) for s, t in dev]
        expected["test"][f"en-{x}"] = list(zip(test_src, test_ref[x]))
    archives["dev.tgz"] = dev_members
    archives["test-full.tgz"] = test_members

    for name, members in archives.items():
        write_archive(root / name, members, compress=name.endswith(".tgz"))
    return expected


def write_checksums(root, path, unknown=()):
    """A checksum file for the mirror's archives (sha256; names in `unknown` recorded as not known)."""
    lines = []
    for archive in sorted(Path(root).iterdir()):
        if archive.name in unknown:
            lines.append(f"- - {archive.name}")
        else:
            lines.append(f"sha256 {hashlib.sha256(archive.read_bytes()).hexdigest()} {archive.name}")
    Path(path).write_text("\n".join(lines) + "\n")
