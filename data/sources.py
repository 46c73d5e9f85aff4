"""Corpus sources: recipe parsing, cached downloads, catalog extraction.

A recipe is two plain-text files of pins (``#`` starts a comment):

* ``recipe_debian.txt``: ``package=version`` lines, fetched with
  ``apt-get download`` (needs a prior ``apt-get update``);
* ``recipe_pypi.txt``: ``name==version`` lines, fetched with
  ``python -m pip download --no-deps``.

Downloads live in ``<cache_dir>/downloads/{debian,pypi}/`` and are reused
when present (a re-run downloads nothing). A pin the archive no longer has
falls back to the current candidate (``apt-get download NAME`` /
``pip download NAME``); :class:`FetchResult` records the version actually
used. Only catalog members (``*.po``, ``*.mo``) are extracted, into
``<cache_dir>/extracted/<archive file name>/``: ``.deb`` through
``dpkg-deb --fsys-tarfile`` (the same payload ``dpkg-deb -x`` unpacks, without
writing the rest of the package to disk), wheels and sdists with
``zipfile``/``tarfile``. Every download and extraction goes to a temporary
name first and is renamed when complete, so a killed build leaves no
half-written file behind.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import zipfile
from typing import Iterable

from m4moe.data import catalogs

DEBIAN_RECIPE = "recipe_debian.txt"
PYPI_RECIPE = "recipe_pypi.txt"
_DOWNLOAD_TIMEOUT_S = 900


class RecipeError(ValueError):
  """A recipe line is malformed; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class Pin:
  """One recipe line.

  Attributes:
    kind: ``"debian"`` or ``"pypi"``.
    name: package name.
    version: pinned version.
    origin: ``file:line`` of the pin.
  """

  kind: str
  name: str
  version: str
  origin: str


@dataclasses.dataclass(frozen=True)
class FetchResult:
  """What happened to one pin.

  Attributes:
    pin: the recipe line.
    status: ``"cached"``, ``"downloaded"``, ``"fallback"`` (pinned version
      unavailable, current candidate used) or ``"skipped"``.
    version_used: version of the archive used ("" when skipped).
    archive: path of the archive ("" when skipped).
    reason: why a pin fell back or was skipped.
  """

  pin: Pin
  status: str
  version_used: str = ""
  archive: str = ""
  reason: str = ""


def read_recipe(path: pathlib.Path, *, kind: str) -> list[Pin]:
  """Parses a recipe file into pins.

  Args:
    path: ``recipe_debian.txt`` or ``recipe_pypi.txt``.
    kind: ``"debian"`` (``name=version``) or ``"pypi"`` (``name==version``).

  Raises:
    RecipeError: a line is not a pin; the message names file and line.
  """
  sep = "==" if kind == "pypi" else "="
  pins = []
  for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(),
                                start=1):
    line = line.split("#", 1)[0].strip()
    if not line:
      continue
    name, found, version = line.partition(sep)
    if not found or not name.strip() or not version.strip() or (
        kind == "debian" and "==" in line):
      raise RecipeError(f"{path}:{lineno}: expected 'name{sep}version', got "
                        f"{line!r}")
    pins.append(Pin(kind, name.strip(), version.strip(), f"{path}:{lineno}"))
  return pins


def read_recipe_dir(recipe_dir: pathlib.Path) -> list[Pin]:
  """Pins of both recipe files in ``recipe_dir`` (a missing file is empty)."""
  pins = []
  for fname, kind in ((DEBIAN_RECIPE, "debian"), (PYPI_RECIPE, "pypi")):
    if (recipe_dir / fname).exists():
      pins.extend(read_recipe(recipe_dir / fname, kind=kind))
  if not pins:
    raise RecipeError(f"{recipe_dir}: no {DEBIAN_RECIPE} or {PYPI_RECIPE} "
                      "with pins")
  return pins


def _pypi_key(name: str) -> str:
  return re.sub(r"[-_.]+", "_", name).lower()


def _cached_archives(pin: Pin, directory: pathlib.Path
                     ) -> list[pathlib.Path]:
  """The cache's archives of ``pin``'s package, the pinned version first."""
  if not directory.is_dir():
    return []
  found = []
  for path in sorted(directory.iterdir()):
    if pin.kind == "debian":
      if path.suffix == ".deb" and path.name.split("_")[0] == pin.name:
        found.append(path)
    elif _pypi_key(path.name.split("-")[0]) == _pypi_key(pin.name):
      found.append(path)
  return sorted(found, key=lambda path: archive_version(
      path, kind=pin.kind) != pin.version)


def archive_version(path: pathlib.Path, *, kind: str) -> str:
  """Version encoded in a ``.deb`` / wheel / sdist file name."""
  if kind == "debian":
    return urllib.parse.unquote(path.name.split("_")[1])
  stem = re.sub(r"(\.tar\.gz|\.tar\.bz2|\.zip|\.whl)$", "", path.name)
  return stem.split("-")[1] if "-" in stem else ""


def _download_command(pin: Pin, spec: str, dest: pathlib.Path) -> list[str]:
  if pin.kind == "debian":
    return ["apt-get", "download", "-q", spec]
  return [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
          "--disable-pip-version-check", "--dest", str(dest), spec]


def _try_download(pin: Pin, spec: str,
                  directory: pathlib.Path) -> tuple[pathlib.Path | None, str]:
  """Downloads into a temp dir, then renames into ``directory``."""
  directory.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=directory, prefix=".tmp-") as tmp:
    try:
      proc = subprocess.run(_download_command(pin, spec, pathlib.Path(tmp)),
                            cwd=tmp, capture_output=True, text=True,
                            timeout=_DOWNLOAD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
      return None, str(e)
    files = [p for p in pathlib.Path(tmp).iterdir() if p.is_file()]
    if proc.returncode != 0 or not files:
      lines = (proc.stderr or proc.stdout).strip().splitlines()
      return None, lines[-1] if lines else f"exit code {proc.returncode}"
    final = directory / files[0].name
    files[0].replace(final)
    return final, ""


def fetch(pin: Pin, *, cache_dir: pathlib.Path,
          tool_available: bool) -> FetchResult:
  """Returns the archive of ``pin``, from the cache or downloaded.

  The pinned version wins: a cached archive of another version (an earlier
  fallback) is used only after the pinned version failed to download again,
  so a build after ``apt-get update`` gets the pinned bytes back.

  Args:
    pin: the recipe line.
    cache_dir: root of the download cache.
    tool_available: False skips the download (e.g. no ``apt-get``); a cached
      archive is still used.
  """
  directory = cache_dir / "downloads" / pin.kind
  cached = _cached_archives(pin, directory)
  if cached and archive_version(cached[0], kind=pin.kind) == pin.version:
    return FetchResult(pin, "cached", pin.version, str(cached[0]))
  if not tool_available:
    if cached:
      return FetchResult(pin, "fallback",
                         archive_version(cached[0], kind=pin.kind),
                         str(cached[0]), "cached archive differs from pin")
    tool = "apt-get" if pin.kind == "debian" else "pip"
    return FetchResult(pin, "skipped", reason=f"{tool} not available")
  sep = "=" if pin.kind == "debian" else "=="
  archive, error = _try_download(pin, f"{pin.name}{sep}{pin.version}",
                                 directory)
  if archive is not None:
    return FetchResult(pin, "downloaded",
                       archive_version(archive, kind=pin.kind), str(archive))
  if pin.kind == "debian":
    error += (" (if the version is a security or point-release update, "
              "run apt-get update as root and build again)")
  if cached:
    return FetchResult(pin, "fallback",
                       archive_version(cached[0], kind=pin.kind),
                       str(cached[0]), f"pinned version failed: {error}; "
                       "the cached version was used")
  archive, error2 = _try_download(pin, pin.name, directory)
  if archive is None:
    return FetchResult(pin, "skipped",
                       reason=f"pinned: {error}; current: {error2}")
  return FetchResult(pin, "fallback", archive_version(archive, kind=pin.kind),
                     str(archive), reason=f"pinned version failed: {error}")


def refresh_apt_lists() -> bool:
  """Runs ``apt-get update`` (root only); whether it succeeded.

  A machine's package lists may predate a Debian point or security release
  (or lack the security suite): the pinned versions then look gone, and a
  build would fall back to older archives and differ from the pinned
  corpus. One refresh before giving up on a pin avoids that.
  """
  if os.geteuid() != 0 or shutil.which("apt-get") is None:
    return False
  try:
    proc = subprocess.run(["apt-get", "update", "-q"], capture_output=True,
                          text=True, timeout=_DOWNLOAD_TIMEOUT_S, check=False)
  except (OSError, subprocess.TimeoutExpired):
    return False
  return proc.returncode == 0


def apt_usable() -> tuple[bool, str]:
  """Whether ``apt-get download`` can run here, and why not."""
  if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
    return False, "apt-get/dpkg-deb not found"
  return True, ""


def _is_catalog(name: str) -> bool:
  return name.endswith(catalogs.CATALOG_SUFFIXES)


def _extract_members(archive: pathlib.Path, dest: pathlib.Path) -> None:
  """Writes the catalog members of ``archive`` under ``dest``."""
  if archive.suffix == ".deb":
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(archive)],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
      with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        _extract_tar(tar, dest)
      proc.stdout.read()
      if proc.wait() != 0:
        raise subprocess.CalledProcessError(
            proc.returncode, "dpkg-deb", stderr=proc.stderr.read())
  elif archive.suffix in (".whl", ".zip"):
    with zipfile.ZipFile(archive) as zf:
      for info in zf.infolist():
        if _is_catalog(info.filename) and not info.is_dir():
          zf.extract(info, dest)
  else:
    with tarfile.open(archive) as tar:
      _extract_tar(tar, dest)


def _extract_tar(tar: tarfile.TarFile, dest: pathlib.Path) -> None:
  for member in tar:
    if member.isfile() and _is_catalog(member.name):
      tar.extract(member, dest, filter="data")


def extract_catalogs(archive: pathlib.Path, *,
                     cache_dir: pathlib.Path) -> pathlib.Path:
  """Extracts the catalogs of an archive once; returns their directory.

  Raises:
    OSError, zipfile.BadZipFile, tarfile.TarError,
    subprocess.CalledProcessError: the archive is unreadable.
  """
  final = cache_dir / "extracted" / archive.name
  if final.is_dir():
    return final
  final.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(dir=final.parent, prefix=".tmp-"))
  try:
    _extract_members(archive, tmp)
    tmp.rename(final)
  finally:
    if tmp.exists():
      shutil.rmtree(tmp, ignore_errors=True)
  return final


class SourceWalk:
  """Finds catalog files under source directories, following symlinks safely.

  Symlinked directories are followed, but every real directory is entered
  once and every real file (same device and inode, whatever the path) is
  returned once, so a symlink loop cannot recurse forever and a catalog
  reachable by two paths is not read twice. What is skipped is recorded in
  :attr:`problems` (the builder counts and lists them):

  * ``source:symlink_loop``: a link pointing back to a directory it is in
    (or links pointing at each other, which the OS reports as ELOOP);
  * ``source:dangling_symlink``: a link whose target does not exist;
  * ``source:duplicate_path``: a file or directory already reached by
    another path (the first path in sorted, depth-first order is kept);
  * ``source:unreadable``: a directory or file that cannot be listed or
    stat'ed (permissions);
  * ``source:not_regular_file``: a ``.po``/``.mo`` name that is a FIFO,
    socket or device.
  """

  def __init__(self):
    self.problems: list[catalogs.Problem] = []
    self._seen_dirs: set[tuple[int, int]] = set()
    self._seen_files: set[tuple[int, int]] = set()

  def _problem(self, kind: str, path: pathlib.Path, reason: str) -> None:
    self.problems.append(catalogs.Problem(kind, str(path), reason))

  def _stat(self, path: pathlib.Path) -> os.stat_result | None:
    try:
      return path.stat()
    except OSError as e:
      if path.is_symlink() and e.errno == errno.ELOOP:
        self._problem("source:symlink_loop", path,
                      f"symlinks point at each other: {e.strerror}")
      elif path.is_symlink() and e.errno in (errno.ENOENT, errno.ENOTDIR):
        self._problem("source:dangling_symlink", path,
                      f"target {os.readlink(path)!r} does not exist")
      else:
        self._problem("source:unreadable", path, str(e))
      return None

  def file(self, path: pathlib.Path) -> bool:
    """Whether ``path`` (a file given or found) should be read."""
    st = self._stat(path)
    if st is None:
      return False
    if not stat.S_ISREG(st.st_mode) and path.suffix in (
        catalogs.CATALOG_SUFFIXES):
      # A file named on the command line may be a pipe: read it as given.
      return True
    key = (st.st_dev, st.st_ino)
    if key in self._seen_files:
      self._problem("source:duplicate_path", path,
                    f"same file as {os.path.realpath(path)}, read once")
      return False
    self._seen_files.add(key)
    return True

  def find_catalogs(self, root: pathlib.Path) -> list[pathlib.Path]:
    """Catalog files under ``root``, sorted; a ``.mo`` beside a ``.po`` of
    the same stem is left out (the ``.po`` holds the same entries plus
    flags). Paths keep their symlinked names (the locale is read from
    them)."""
    paths = []
    st = self._stat(root)
    if st is not None:
      self._seen_dirs.add((st.st_dev, st.st_ino))
      self._walk(root, {(st.st_dev, st.st_ino)}, paths)
    paths.sort()
    po_stems = {p.with_suffix("") for p in paths if p.suffix == ".po"}
    return [p for p in paths
            if p.suffix == ".po" or p.with_suffix("") not in po_stems]

  def _walk(self, directory: pathlib.Path, ancestors: set[tuple[int, int]],
            out: list[pathlib.Path]) -> None:
    try:
      names = sorted(os.listdir(directory))
    except OSError as e:
      self._problem("source:unreadable", directory, str(e))
      return
    for name in names:
      path = directory / name
      st = self._stat(path)
      if st is None:
        continue
      key = (st.st_dev, st.st_ino)
      if stat.S_ISDIR(st.st_mode):
        if key in ancestors:
          self._problem("source:symlink_loop", path,
                        f"points back to {os.path.realpath(path)}, which "
                        "contains it; not followed")
        elif key in self._seen_dirs:
          self._problem("source:duplicate_path", path,
                        f"same directory as {os.path.realpath(path)}, read "
                        "once")
        else:
          self._seen_dirs.add(key)
          self._walk(path, ancestors | {key}, out)
      elif path.suffix in catalogs.CATALOG_SUFFIXES:
        if not stat.S_ISREG(st.st_mode):
          self._problem("source:not_regular_file", path,
                        "not a regular file (pipe, socket or device)")
        elif key in self._seen_files:
          self._problem("source:duplicate_path", path,
                        f"same file as {os.path.realpath(path)}, read once")
        else:
          self._seen_files.add(key)
          out.append(path)


def find_catalogs(root: pathlib.Path) -> list[pathlib.Path]:
  """Catalog files under ``root`` (see :meth:`SourceWalk.find_catalogs`)."""
  return SourceWalk().find_catalogs(root)


def iter_source_files(sources: Iterable[pathlib.Path], *,
                      walk: SourceWalk | None = None) -> list[pathlib.Path]:
  """Expands local sources: directories to their catalogs; files as given
  (each real file once, see :class:`SourceWalk`)."""
  walk = SourceWalk() if walk is None else walk
  out = []
  for src in sources:
    if src.is_dir():
      out.extend(walk.find_catalogs(src))
    elif walk.file(src):
      out.append(src)
  return out


def packaged_recipe_dir() -> pathlib.Path:
  """The recipe shipped in the package (``data/recipes/*.txt``)."""
  return pathlib.Path(__file__).parent / "recipes"
