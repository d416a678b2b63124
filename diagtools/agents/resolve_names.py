"""The name check of a patch: does ``from MODULE import NAME`` still give each re-exported name?

Run by the runner as a fresh subkernel, apart from the patch's rescan: resolving
a lazy name imports what it names, which may initialize CUDA, so this run
judges only whether every name still resolves.  Events go to the runner's
private pipe: one ``resolved`` per name, then ``done``.
"""

import sys

import _diagtools_protocol as protocol  # registered by the runner's bootstrap

_ENV = protocol.environ()
_channel = protocol.channel_from(_ENV)


def _resolve(module, name):
    try:
        value = getattr(__import__(module, fromlist=[name]), name)
    except BaseException as exc:
        _channel.emit("resolved", module=module, name=name, ok=False, error=protocol.describe(exc, limit=2000))
        return
    origin = getattr(value, "__module__", None) or getattr(value, "__name__", None)
    _channel.emit("resolved", module=module, name=name, ok=True, origin=origin if isinstance(origin, str) else None)


def main():
    protocol.guard_agent(_ENV, None)
    sys.path[0:0] = [p for p in _ENV.get(protocol.RESOLVE_PATH, "").split("\n") if p]
    _channel.emit("hello", pid=0, python=sys.version)
    for line in _ENV.get(protocol.RESOLVE_NAMES, "").split("\n"):
        module, _, name = line.partition(" ")
        if module and name:
            _resolve(module, name)
    _channel.emit("done")
    protocol.exit_if_channel_lost(_channel)


if __name__ == "__main__":
    main()
