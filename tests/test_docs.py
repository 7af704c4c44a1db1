"""The documentation holds together: links resolve, the commands it shows take valid overrides, the README stays
short, the LICENSE is the Apache 2.0 text, and the app passes the checks `flwr app publish` runs before an upload.

Fast (a few seconds): no model, no data, no Flower run.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import re
import shlex
import subprocess
import tomllib
import zipfile
from pathlib import Path

import click
import pytest
from flwr.cli.build import build_fab_from_files
from flwr.cli.config_utils import load_and_validate
from flwr.cli.utils import filter_paths_for_publish, validate_project_name
from flwr.common.config import parse_config_args

from fedrapp_app.config import ConfigError, RunConfig
from fedrapp_app.running.launch import app_overrides

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pathspec.*")  # Flower's publish filter

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted([README, *(ROOT / "docs").rglob("*.md")])

#: sha256 of https://www.apache.org/licenses/LICENSE-2.0.txt (11,358 bytes, the APPENDIX included).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
README_MAX_BYTES = 20_000

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HTML_ID = re.compile(r"<a\s+[^>]*(?:name|id)=\"([^\"]+)\"", re.I)


# -- markdown, as GitHub reads it -------------------------------------------------------------------------------


def split_fences(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The prose lines (fenced blocks blanked out) and the fenced blocks as (info word, lines)."""
    prose: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    fence = None
    for line in text.splitlines():
        found = _FENCE.match(line)
        if fence is None and found:
            fence, info = found.group(1), found.group(2).lower()
            blocks.append((info, []))
            prose.append("")
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            else:
                blocks[-1][1].append(line)
            prose.append("")
        else:
            prose.append(line)
    return prose, blocks


def _inline_text(text: str) -> str:
    """A heading's rendered text: links and images by their text, code spans and emphasis without markers."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("`", "").replace("*", "")


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation and symbols dropped, spaces to hyphens."""
    text = _inline_text(heading).strip().lower()
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a link may name in a markdown text: its headings (GitHub's slugs, repeats numbered) and
    explicit HTML ids."""
    prose, _ = split_fences(text)
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose:
        heading = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_slug(heading.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        found.update(_HTML_ID.findall(line))
    return found


def relative_links(text: str) -> list[str]:
    """The link targets of a markdown text that point inside the repository (inline, images, references)."""
    prose, _ = split_fences(text)
    targets: list[str] = []
    for line in prose:
        ref = _REF_DEF.match(line)
        if ref:
            targets.append(ref.group(1))
            continue
        targets += _LINK.findall(re.sub(r"`[^`]*`", "", line))
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]


def test_slugs_follow_githubs_rules():
    assert github_slug("The algorithm: what is the paper's and what is ours") == (
        "the-algorithm-what-is-the-papers-and-what-is-ours"
    )
    assert github_slug("What `fedrapp-sim` does") == "what-fedrapp-sim-does"
    assert github_slug("Personalization that never hurts: the trust option (ours)") == (
        "personalization-that-never-hurts-the-trust-option-ours"
    )
    assert github_slug("5. GPU table (for the README)") == "5-gpu-table-for-the-readme"
    assert github_slug("Set-up and a run") == "set-up-and-a-run"


def test_link_parsing_skips_code_and_external_targets():
    page = (
        "# Title\n\nSee [a](a.md#x), ![fig](img/f.png) and [web](https://x.org) `[not](code.md)`.\n\n"
        "```bash\n# [no](fenced.md)\n```\n\n[ref]: ref.md\n## Title\n"
    )
    assert relative_links(page) == ["a.md#x", "img/f.png", "ref.md"]
    assert anchors(page) == {"title", "title-1"}


def broken_links(page: Path) -> list[str]:
    """The relative links of a markdown file whose file, or whose anchor in a markdown file, does not exist."""
    broken = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file or folder")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {resolved.name}")
    return broken


def test_broken_links_and_anchors_are_reported(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A section\n", encoding="utf-8")
    (tmp_path / "img").mkdir()
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#a-section) [ok](img/) [ok](#page) [gone](missing.md) "
        "[bad anchor](other.md#no-section) [bad local](#nowhere)\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "missing.md: no such file or folder",
        "other.md#no-section: no heading with the anchor #no-section in other.md",
        "#nowhere: no heading with the anchor #nowhere in page.md",
    ]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_to_files_and_headings(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}: broken links:\n  " + "\n  ".join(broken)


# -- the commands the documentation shows ------------------------------------------------------------------------


def shown_commands(text: str) -> list[list[str]]:
    """Every `fedrapp-sim ...` and `flwr run ...` command in the shell blocks of a markdown text, as words
    (line continuations joined, comments dropped, `a && b` split)."""
    _, blocks = split_fences(text)
    commands: list[list[str]] = []
    for info, lines in blocks:
        if info not in ("bash", "sh", "shell", "console", "zsh"):
            continue
        for line in "\n".join(lines).replace("\\\n", " ").splitlines():
            words = shlex.split(line.removeprefix("$ "), comments=True)
            command: list[str] = []
            for word in [*words, "&&"]:
                if word in ("&&", "||", ";", "|", "&"):
                    if command[:1] == ["fedrapp-sim"] or command[:2] == ["flwr", "run"]:
                        commands.append(command)
                    command = []
                else:
                    command.append(word)
    return commands


def overrides_of(command: list[str]) -> list[str]:
    """The values of a command's `-c` / `--run-config` options."""
    return [command[i + 1] for i, word in enumerate(command[:-1]) if word in ("-c", "--run-config")]


def _defaults() -> dict:
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])


def check_overrides(command: list[str]) -> None:
    """Validate a shown command's overrides as the command reads them, then with the project's own validator.

    `fedrapp-sim` reads them with its own parser (`app_overrides`: files and k=v strings, bare words for text
    keys); `flwr run` with Flower's (`parse_config_args`: one file or k=v pairs, TOML values). An override
    file that exists only on a user's machine (not in the repository) is left out; k=v values that name a
    user's folders are still read and validated (the validator does not look at the disk).
    """
    given = [o for o in overrides_of(command) if not o.endswith(".toml") or (ROOT / o).is_file()]
    given = [str(ROOT / o) if o.endswith(".toml") else o for o in given]
    fedrapp_sim = command[0] == "fedrapp-sim"
    RunConfig.from_run_config(
        app_overrides(ROOT, given) if fedrapp_sim else {**_defaults(), **parse_config_args(given)}
    )


SHOWN = [
    (page, command)
    for page in DOCS
    for command in shown_commands(page.read_text(encoding="utf-8"))
    if overrides_of(command)
]


def test_the_readme_shows_override_examples():
    """The scan finds the README's examples (a parser that found none would pass everything)."""
    readme = [command for page, command in SHOWN if page == README]
    assert len(readme) >= 4, readme
    assert any(command[0] == "fedrapp-sim" for command in readme)


@pytest.mark.parametrize("page, command", SHOWN, ids=[f"{p.relative_to(ROOT)}: {' '.join(c)[:60]}" for p, c in SHOWN])
def test_shown_overrides_parse_and_validate(page, command):
    try:
        check_overrides(command)
    except (ConfigError, ValueError) as err:
        pytest.fail(f"{page.relative_to(ROOT)} shows `{shlex.join(command)}`, which is refused:\n{err}")


def test_a_bad_shown_override_is_caught():
    with pytest.raises(ConfigError, match="dirichlet-alpha"):
        check_overrides(["fedrapp-sim", "-c", "dirichlet-alpha=-1.0"])
    with pytest.raises(ConfigError, match="no-such-key"):
        check_overrides(["flwr", "run", ".", "-c", "no-such-key=1"])


def test_commands_are_read_from_shell_blocks_only():
    page = (
        'fedrapp-sim -c "seed=9"\n\n```bash\nfedrapp-sim -c "seed=1"   # a comment\nflwr run . \\\n  -c x=1\n'
        "pip install -e . && fedrapp-sim -c y=2\n```\n\n```text\nfedrapp-sim -c z=3\n```\n"
    )
    assert shown_commands(page) == [
        ["fedrapp-sim", "-c", "seed=1"],
        ["flwr", "run", ".", "-c", "x=1"],
        ["fedrapp-sim", "-c", "y=2"],
    ]


# -- the README, the LICENSE ---------------------------------------------------------------------------------------


def test_readme_is_short():
    """The README stays a front page (Flower's example apps keep theirs short); depth lives in docs/."""
    size = len(README.read_bytes())
    assert size < README_MAX_BYTES, f"README.md is {size:,} bytes (limit {README_MAX_BYTES:,}); move depth into docs/"


def test_license_is_the_apache_2_text():
    data = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(data).hexdigest() == APACHE_2_SHA256, "LICENSE is not the verbatim Apache 2.0 text"
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"


# -- Flower Hub: the checks of `flwr app publish` (flwr 1.42), without the login and the upload ----------------------


def _tracked_files() -> dict[str, Path]:
    """The files a fresh clone holds (what docs/deployment.md says to publish from)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the files of a fresh clone are unknown")
    return {name: ROOT / name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()}


def test_the_app_passes_flower_hubs_publish_checks():
    # the module itself: the package's attribute of that name is the `publish` command function
    publish = importlib.import_module("flwr.cli.app_cmd.publish")
    config, warnings = load_and_validate(ROOT / "pyproject.toml", check_module=False)
    assert not warnings
    validate_project_name(config["project"]["name"], "[project].name")
    publish._validate_description(config["project"]["description"])
    assert len(config["project"]["description"]) <= 200  # above, publish asks before going on
    files = filter_paths_for_publish(_tracked_files())
    assert "LICENSE" in files and "README.md" in files
    try:
        publish._validate_files(sorted(Path(p) for p in files.values()))  # count, 1 MiB each, 10 MiB, UTF-8
    except click.ClickException as err:
        pytest.fail(f"flwr app publish would refuse the upload: {err.message}")
    fab, _ = build_fab_from_files(files)  # what Flower Hub builds from the upload
    names = set(zipfile.ZipFile(io.BytesIO(fab)).namelist())
    assert names == {"pyproject.toml", "LICENSE", "README.md", "client_app.py", "server_app.py", ".info/CONTENT"}
