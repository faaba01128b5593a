"""The docs hold to the code: the configuration reference is the schema, the examples
parse, links resolve, and nothing points outside the repository or reads as a notebook."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from santhrottle.appliance.config import defaults, parse_config
from santhrottle.appliance.config.schema import KEYS, toml_value

ROOT = Path(__file__).parents[2]
DOCS = sorted((ROOT / "docs").rglob("*.md"))
MARKDOWN = [ROOT / "README.md", *DOCS, *sorted((ROOT / "vagrant").rglob("README.md")),
            *sorted((ROOT / "ansible").rglob("README.md"))]  # fmt: skip
CONFIGURE = ROOT / "docs" / "configure.md"
ROW = re.compile(r"^\| `(?P<key>[a-zA-Z_.]+)` \| `(?P<default>[^`]*)` \|")


def _documented_keys() -> dict[str, str]:
    out = {}
    for line in CONFIGURE.read_text().splitlines():
        m = ROW.match(line)
        if m:
            assert m["key"] not in out, f"{m['key']} documented twice"
            out[m["key"]] = m["default"]
    return out


def test_every_documented_key_is_in_the_schema_with_its_default_and_the_reverse():
    documented = _documented_keys()
    schema = {k.dotted: toml_value(k.default) for k in KEYS}
    assert set(documented) == set(schema), (
        f"only in the docs: {sorted(set(documented) - set(schema))}; "
        f"only in the schema: {sorted(set(schema) - set(documented))}"
    )
    for key, value in schema.items():
        assert documented[key] == value, f"{key}: docs say {documented[key]}, schema {value}"


def _toml_blocks(path: Path) -> list[str]:
    return re.findall(r"```toml\n(.*?)```", path.read_text(), flags=re.S)


FIXED = ("daemon", "datapath", "controller", "metrics", "metering")  # the full example's


def test_the_full_example_parses_and_sets_every_default():
    blocks = _toml_blocks(CONFIGURE)
    assert len(blocks) >= 2
    full = parse_config(blocks[-1], "example.toml")
    ref = defaults()
    for attr in ("control_socket", "socket_mode", "ports", "write_mode", "step_us",
                 "max_delay_us", "link_bits_s", "leaf", "glide_leaves", "controller",
                 "metrics_address", "metrics_port", "keep_static_state", "metering"):  # fmt: skip
        assert getattr(full, attr) == getattr(ref, attr), attr
    written = {f"{t}.{k}" for t, table in tomllib.loads(blocks[-1]).items()
               if t in FIXED for k in table}  # fmt: skip
    commented = set(re.findall(r"^# (\w+) = ", blocks[-1], flags=re.M))
    for k in KEYS:
        if k.table in FIXED:
            assert k.dotted in written or k.name in commented, f"{k.dotted} missing"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_toml_example_in_the_docs_parses(path):
    for block in _toml_blocks(path):
        if "[datapath]" in block or "[resources." in block or "[controller]" in block:
            parse_config(block, f"{path.name} example")


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve_inside_the_repository(path):
    text = path.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            continue
        dest = (path.parent / target.split("#")[0]).resolve()
        assert ROOT in dest.parents or dest == ROOT, f"{target} points outside the repository"
        assert dest.exists(), f"{path.name}: broken link {target}"


# [page](page.md), "Section": the section a link names, a heading or a bold title there
SECTION_REF = re.compile(r"\[[^\]]+\]\(([^)#\s]+\.md)\),?\s+\"([^\"]+)\"")


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_section_a_link_names_is_on_that_page(path):
    wrong = []
    for target, section in SECTION_REF.findall(path.read_text()):
        text = (path.parent / target).read_text()
        titles = [h.replace("`", "") for h in re.findall(r"^#+ (.*)$", text, re.M)]
        titles += [b.replace("`", "") for b in re.findall(r"\*\*([^*]+?)\.?\*\*", text)]
        want = " ".join(section.split()).replace("`", "")
        if not any(t.startswith(want) for t in titles):
            wrong.append(f"{target}, {section!r}")
    assert not wrong, wrong


NOTEBOOK = [
    r"lab-notes",
    r"\.\./shared",
    r"(?im)^#+ .*(next steps|findings so far|history)",
    r"\btrial ?\d+\b",
    r"\bsession \d+\b",
    r"\bround \d+ of (the )?work\b",
    r"(?im)^#+ .*\b(today|not yet)\b",  # a run is named by its date; limits are limits
    r"\b[Tt]oday's (runs?|rules?|plant|controller)\b",
    r"\(now `make ",
]


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_are_a_manual_not_a_notebook(path):
    text = path.read_text()
    for pattern in NOTEBOOK:
        m = re.search(pattern, text)
        assert m is None, f"{path.name}: {m.group(0)!r}"


def test_the_code_points_nowhere_outside_the_repository():
    for folder in ("appliance", "controller", "bridge", "tests", "vagrant", "ansible", "systemd"):
        for p in (ROOT / folder).rglob("*"):
            if p == Path(__file__) or p.suffix not in (".py", ".md", ".toml", ".yml", ".j2"):
                continue
            if p.is_file():
                text = p.read_text(errors="replace")
                assert "lab-notes" not in text and "../shared" not in text, p
