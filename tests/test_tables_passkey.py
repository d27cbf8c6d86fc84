"""``eval=passkey`` without explicit lengths follows the model's window (explicit ones that do not fit stay errors)."""

from attnlab.eval.passkey import MAX_NEW_TOKENS, default_lengths


def test_default_passkey_lengths_fit_the_window() -> None:
    assert default_lengths(2048) == [256, 512, 1024]  # the paper's lengths that leave room for the answer
    assert default_lengths(256) == [123, 246]  # the default tiny model: half its window and all of it
    assert all(n + MAX_NEW_TOKENS <= 256 for n in default_lengths(256))
