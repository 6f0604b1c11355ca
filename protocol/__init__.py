"""Pure codecs for every byte the Unreal Learning Agents engine and the trainer exchange.

No IO lives here: bytes or writable buffers in, typed values out, and back (spec: docs/protocol.md).
"""
