"""The app folder as ``flwr run`` packs it, staged without walking what ``.gitignore`` keeps out.

``flwr run <app>`` builds the app's FAB from every file under the folder and only then drops what
``.gitignore`` and Flower's publish rules exclude: a folder with the results of many runs (``outputs/``, tens
of thousands of files after a benchmark) costs seconds per run before anything starts. :func:`stage_app`
links the files Flower would pack into a scratch folder, skipping ignored folders without entering them;
``flwr run`` on that folder builds the same FAB (the same bytes, so the same hash) at once.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pathspec


def _spec(lines: list[str]) -> pathspec.PathSpec:
    """The patterns as Flower compiles them (``flwr.cli.utils.build_pathspec``: pathspec's ``gitwildmatch``, which
    newer pathspec releases call deprecated; the same rules as Flower matter more than the newer name)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pathspec.PathSpec.from_lines("gitwildmatch", lines)


def packed_files(app_dir: Path) -> dict[str, Path]:
    """Relative POSIX path -> file, for every file of ``app_dir`` that Flower's publish rules and the app's
    ``.gitignore`` keep (``flwr.cli.utils.filter_paths_for_publish`` filters the staged copy once more).

    Folders ``.gitignore`` excludes are not entered, unless it has a negation (``!``) pattern, which may take a
    file back out of an excluded folder: then every folder is walked, as Flower does. Symbolic links are left
    out, as Flower leaves them out.
    """
    from flwr.supercore.constant import APP_PUBLISH_EXCLUDE_PATTERNS, APP_PUBLISH_INCLUDE_PATTERNS

    root = Path(app_dir).resolve()
    try:
        ignore_lines = (root / ".gitignore").read_text().splitlines()
    except OSError:
        ignore_lines = []
    ignored = _spec(ignore_lines)
    prune = not any(line.strip().startswith("!") for line in ignore_lines)
    include, exclude = _spec(list(APP_PUBLISH_INCLUDE_PATTERNS)), _spec(list(APP_PUBLISH_EXCLUDE_PATTERNS))
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        relative_dir = here.relative_to(root).as_posix()
        prefix = "" if relative_dir == "." else relative_dir + "/"
        dirnames[:] = [
            d for d in dirnames if d != ".git" and not (prune and ignored.match_file(f"{prefix}{d}/"))
        ]  # Flower never packs the git folder
        for name in filenames:
            relative = prefix + name
            path = here / name
            if path.is_symlink() or not include.match_file(relative) or exclude.match_file(relative):
                continue
            if not ignored.match_file(relative):
                files[relative] = path
    return files


def stage_app(app_dir: Path, into: Path) -> Path:
    """Hard-link (copy, across file systems) :func:`packed_files` of ``app_dir`` into ``into``; returns ``into``."""
    for relative, source in packed_files(app_dir).items():
        target = into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
    return into
