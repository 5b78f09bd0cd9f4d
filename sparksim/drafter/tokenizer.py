"""A byte-level tokenizer: ids 0..255 are bytes, then BOS, EOS, PAD and MASK."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ByteTokenizer:
    """Encode text as UTF-8 bytes; the four special ids follow the 256 byte ids."""

    name: str = "bytes-v1"
    bos_id: int = 256
    eos_id: int = 257
    pad_id: int = 258
    mask_id: int = 259
    vocab_size: int = 260

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        """Return the byte ids of `text`, preceded by BOS unless `bos` is False."""
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if bos else ids

    def decode(self, ids: list[int]) -> str:
        """Return the text of `ids`, dropping special ids and replacing broken UTF-8."""
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def get_tokenizer(name: str) -> ByteTokenizer:
    """Return the tokenizer registered under `name`."""
    from sparksim.errors import ConfigError

    if name != "bytes-v1":
        raise ConfigError(f"tokenizer {name!r} is unknown (known: ['bytes-v1'])")
    return ByteTokenizer()
