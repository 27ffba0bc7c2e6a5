"""Byte-level tokenizer: token id = byte value, so any string round-trips and nothing is downloaded."""

from __future__ import annotations

import codecs


class ByteTokenizer:
    """UTF-8 bytes in, bytes out. Decoding replaces broken sequences instead of raising."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")

    def stream_decoder(self) -> codecs.IncrementalDecoder:
        """A decoder for streaming: it holds back a multi-byte character until its last byte arrives."""
        return codecs.getincrementaldecoder("utf-8")(errors="replace")
