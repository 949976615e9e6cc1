"""Predict, then see: the comparison line a notebook prints after a guess."""

from __future__ import annotations

import math

import pytest

from minipaged.course.predict import NO_GUESS, matches, verdict


def test_no_guess_asks_for_one_and_never_shows_the_answer():
    line = verdict(None, [5, 6, 7, 8, 9, 2])
    assert line == NO_GUESS and "5, 6, 7" not in line


@pytest.mark.parametrize(
    "guess,answer,tolerance,right",
    [
        ([5, 6, 7, 8, 9, 2], [5, 6, 7, 8, 9, 2], 0, True),
        ([5, 6, 7, 8, 9, 1], [5, 6, 7, 8, 9, 2], 0, False),
        (8, 8.3, 0.5, True),
        (9, 8.3, 0.5, False),
        (" Most", "most", 0, True),
        ("a few", "most", 0, False),
        ((60, 8, 30), (66, 8, 32), (5, 0, 5), False),  # 60 is 6 away from 66
        ((63, 8, 30), (66, 8, 32), (5, 0, 5), True),
        ((63, 9, 30), (66, 8, 32), (5, 0, 5), False),  # no tolerance on the middle item
        (((3, 7), 8, True), ((3, 7), 8, True), 0, True),
        ([1, 17], [1, 17, 33], 0, False),  # lengths differ
        (True, 1, 0, False),  # a yes/no guess is not a number
        ("nan", math.nan, 0, True),
        (None, None, 0, True),
    ],
)
def test_matches(guess, answer, tolerance, right):
    assert matches(guess, answer, tolerance) is right


def test_verdict_says_guess_answer_and_outcome():
    assert verdict(4096, 1024) == "you predicted 4096; it is 1024: not quite: open the Why below."
    assert verdict((3, 7), (3, 7)) == "you predicted (3, 7); it is (3, 7): right."


def test_until_guessed_holds_the_prints_back_without_a_guess(capsys):
    from minipaged.course.predict import until_guessed

    with until_guessed(None):
        print("it is 8.3")
    assert capsys.readouterr().out == ""
    with until_guessed(8):
        print("it is 8.3")
    assert capsys.readouterr().out == "it is 8.3\n"
    with pytest.raises(ZeroDivisionError), until_guessed(None):
        print("before the error")
        raise ZeroDivisionError
    assert capsys.readouterr().out == "before the error\n"
