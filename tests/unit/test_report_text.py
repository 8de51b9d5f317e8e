"""The console summary's text: a sample from an untrained byte-level model is arbitrary bytes."""

from scaletrain.trainer.report import printable


def test_printable_escapes_control_characters_and_keeps_text():
    raw = "the cat\tsat\n\x1b[2J\x07\x00 caf\u00e9 \ufffd"
    out = printable(raw)
    assert out == "the cat\tsat\n\\x1b[2J\\x07\\x00 caf\u00e9 \ufffd"
    assert all(c.isprintable() or c in "\n\t" for c in out)
    assert printable("plain text") == "plain text"
