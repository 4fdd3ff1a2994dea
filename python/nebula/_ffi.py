"""The cffi binding of libnebula, in ABI mode: include/nebula.h is read at import time, reduced
to the declarations cffi's parser takes, and libnebula.so is dlopen'ed. No compiler is needed and
the header stays the one source of the declarations; nothing here restates them.

Not the Pythonic layer (that is nebula/__init__.py): this module only finds, parses and loads.
"""

from __future__ import annotations

import ctypes.util
import os
import re

import cffi

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
# python/nebula/ -> the repository root, when the package is used from a source tree
_SOURCE_ROOT = os.path.dirname(os.path.dirname(_PKG_DIR))
_LIB_NAMES = ("libnebula.so", "libnebula.so.0", "libnebula.dylib")


def cdef_from_header(text: str) -> str:
    """The declarations of a C header as cffi's cdef takes them.

    Drops comments, the `#ifdef __cplusplus` blocks (the `extern "C"` braces), every other
    preprocessor line except `#define NAME <integer>` (cffi turns those into lib constants), and
    nothing else: a declaration the parser cannot take is an error here, not a silent gap.
    """
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    out = []
    stack = []  # one entry per open #if: True where its lines are dropped
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith("#"):
            if not any(stack):
                out.append(line)
            continue
        directive = s[1:].strip()
        if directive.startswith(("if", "ifdef", "ifndef")):
            stack.append(directive.split()[:2] == ["ifdef", "__cplusplus"])
        elif directive.startswith("endif"):
            if stack:
                stack.pop()
        elif directive.startswith(("else", "elif")):
            if stack and stack[-1]:
                stack[-1] = False  # the non-C++ branch of an #ifdef __cplusplus
        elif not any(stack):
            m = re.fullmatch(r"define\s+([A-Za-z_]\w*)\s+(-?\d+)", directive)
            if m:
                out.append(f"#define {m.group(1)} {m.group(2)}")
    return "\n".join(out) + "\n"


def _in_source_tree() -> bool:
    """The package is python/nebula/ of a nebula checkout (not an installed copy)."""
    return os.path.exists(os.path.join(_SOURCE_ROOT, "include", "nebula.h")) and os.path.exists(
        os.path.join(_SOURCE_ROOT, "api", "libnebula.map")
    )


def _lib_candidates():
    env = os.environ.get("NEBULA_LIB")
    if env:
        # a file, or a folder that holds one: the caller's word is final, nothing else is tried
        if os.path.isdir(env):
            return [os.path.join(os.path.abspath(env), n) for n in _LIB_NAMES]
        return [os.path.abspath(env)]
    c = [os.path.join(_PKG_DIR, n) for n in _LIB_NAMES]  # shipped next to the package
    if _in_source_tree():
        c += [os.path.join(_SOURCE_ROOT, "build", "lib", n) for n in _LIB_NAMES]  # the build tree
    found = ctypes.util.find_library("nebula")  # ld.so's paths (an installed prefix)
    if found:
        c.append(found)
    return c


def find_library() -> str:
    """Where libnebula is: NEBULA_LIB (a file or a folder), next to this package, the source
    tree's build/lib, or the system loader's paths, in that order."""
    tried = []
    for path in _lib_candidates():
        if os.path.isabs(path) and not os.path.exists(path):
            tried.append(path)
            continue
        return path
    raise ImportError(
        "nebula: libnebula.so not found (tried "
        + ", ".join(tried)
        + "); build it (cmake --build build) or set NEBULA_LIB to its path"
    )


def find_header(lib_path: str) -> str:
    """Where nebula.h is: NEBULA_HEADER, next to this package, <libdir>/../include (an install
    prefix, and the build tree, where CMake copies it), or the source tree's include/."""
    env = os.environ.get("NEBULA_HEADER")
    if env:
        return env
    libdir = os.path.dirname(os.path.realpath(lib_path)) if os.path.isabs(lib_path) else None
    c = [os.path.join(_PKG_DIR, "nebula.h")]
    if libdir:
        c.append(os.path.join(os.path.dirname(libdir), "include", "nebula.h"))
    if _in_source_tree():
        c.append(os.path.join(_SOURCE_ROOT, "include", "nebula.h"))
    for path in c:
        if os.path.exists(path):
            return path
    raise ImportError(
        "nebula: nebula.h not found (tried " + ", ".join(c) + "); set NEBULA_HEADER to its path"
    )


def load():
    """(ffi, lib, lib_path, header_path): the header parsed and the library opened."""
    lib_path = find_library()
    header_path = find_header(lib_path)
    with open(header_path, encoding="utf-8") as f:
        cdef = cdef_from_header(f.read())
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    try:
        lib = ffi.dlopen(lib_path)
    except OSError as e:
        raise ImportError(f"nebula: cannot load {lib_path}: {e}") from e
    return ffi, lib, lib_path, header_path


ffi, lib, lib_path, header_path = load()
