"""Prompts in, checked, without an engine: what ``inputs`` accepts, and every refusal with the
words that say what to change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minipaged import SamplingParams
from minipaged.engine.inputs import Limits, as_params_list, as_prompt_list, check_request, encode, token_ids_of
from minipaged.engine.sampling_params import BeamSearchParams
from minipaged.model.tokenizer import ByteTokenizer

GREEDY = SamplingParams(temperature=0, max_tokens=4)


def limits(**kw) -> Limits:
    base = dict(
        vocab_size=50,
        max_model_len=20,
        max_num_seqs=3,
        max_num_batched_tokens=8,
        has_tokenizer=False,
        can_fork=True,
        kv_room=lambda tokens, seqs: None,
    )
    return Limits(**{**base, **kw})


def refused(ids, params, lim=None, index=0) -> str:
    with pytest.raises(ValueError) as e:
        check_request(ids, params, index, lim or limits())
    return str(e.value)


# -- prompts and params --------------------------------------------------------------------
@pytest.mark.parametrize(
    "prompts, want",
    [
        ("abc", ["abc"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ((4, 5), [(4, 5)]),
        (["a", "b"], ["a", "b"]),
        ([[1, 2], (3,)], [[1, 2], (3,)]),
        ([], []),
    ],
    ids=["text", "ids", "tuple", "texts", "id-lists", "none"],
)
def test_as_prompt_list(prompts, want):
    assert as_prompt_list(prompts) == want


def test_as_prompt_list_takes_a_1d_array_as_one_prompt_and_refuses_2d():
    arr, ten = np.array([1, 2, 3]), torch.tensor([4, 5])
    assert [p is arr for p in as_prompt_list(arr)] == [True]
    assert [p is ten for p in as_prompt_list(ten)] == [True]
    two = as_prompt_list([np.array([1]), torch.tensor([2, 3])])
    assert [p.tolist() for p in two] == [[1], [2, 3]]
    with pytest.raises(ValueError, match=r"must be 1-D token ids, got shape \(2, 2\)"):
        as_prompt_list(np.array([[1, 2], [3, 4]]))
    with pytest.raises(ValueError, match=r"got shape \(1, 3\)"):
        as_prompt_list(torch.zeros(1, 3, dtype=torch.long))


def test_as_params_list():
    assert as_params_list(None, 2) == [SamplingParams(), SamplingParams()]
    assert as_params_list(GREEDY, 3) == [GREEDY] * 3
    other = SamplingParams(max_tokens=2)
    assert as_params_list([GREEDY, other], 2) == [GREEDY, other]
    assert as_params_list((other,), 1) == [other]
    with pytest.raises(ValueError, match="2 sampling params for 3 prompts"):
        as_params_list([GREEDY, other], 3)


def test_encode_text_and_ids():
    tok = ByteTokenizer(["<end>", "<eos>"], "<eos>")
    assert encode("hi<end>", 0, tok) == ("hi<end>", [104, 105, 256])
    assert encode([7, 8], 0, None) == (None, [7, 8])
    with pytest.raises(ValueError, match="prompt 2 is text but this model folder has no tokenizer: pass token ids"):
        encode("hi", 2, None)


@pytest.mark.parametrize(
    "prompt",
    [
        [3, 1, 4],
        (3, 1, 4),
        np.array([3, 1, 4]),
        np.array([3, 1, 4], dtype=np.int32),
        np.array([3, 1, 4], dtype=np.uint8),
        torch.tensor([3, 1, 4]),
        torch.tensor([3, 1, 4], dtype=torch.int16),
        [np.int64(3), np.int32(1), 4],
    ],
    ids=["list", "tuple", "np-int64", "np-int32", "np-uint8", "torch-int64", "torch-int16", "np-scalars"],
)
def test_token_ids_of_accepts_integer_ids_as_python_ints(prompt):
    ids = token_ids_of(prompt, 0)
    assert ids == [3, 1, 4] and [type(t) for t in ids] == [int, int, int]


@pytest.mark.parametrize(
    "prompt, error, message",
    [
        (
            torch.tensor([1.0, 2.0]),
            TypeError,
            "prompt 1: an array prompt must hold integer token ids, got torch.float32",
        ),
        (torch.tensor([True, False]), TypeError, "must hold integer token ids, got torch.bool"),
        (np.array([True]), TypeError, "must hold integer token ids, got bool"),
        (torch.zeros(2, 2, dtype=torch.long), ValueError, r"prompt 1: an array prompt must be 1-D .* shape \(2, 2\)"),
        ([1, np.bool_(True)], TypeError, "token ids must be ints, got .*True_? at position 1"),
        ([1, 2, "3"], TypeError, "token ids must be ints, got '3' at position 2"),
        ({1, 2}, TypeError, "prompt 1 must be a string or a list of token ids, got set"),
        (7, TypeError, "got int"),
    ],
)
def test_token_ids_of_refuses_what_is_not_integer_ids(prompt, error, message):
    with pytest.raises(error, match=message):
        token_ids_of(prompt, 1)


# -- check_request: what is refused --------------------------------------------------------
def test_accepts_a_request_that_fits_exactly():
    check_request([0, 49], SamplingParams(max_tokens=18), 0, limits())  # 2 + 18 = max_model_len
    check_request([1] * 4, BeamSearchParams(beam_width=3, max_tokens=4), 0, limits())
    check_request([1], SamplingParams(n=3, stop_token_ids=[49]), 0, limits())


def test_params_of_the_wrong_type_are_refused():
    with pytest.raises(TypeError, match="sampling params of prompt 4 must be a SamplingParams, got dict"):
        check_request([1], {"temperature": 0}, 4, limits())


def test_empty_prompt():
    assert refused([], GREEDY, index=3) == "prompt 3 is empty"


def test_ids_outside_the_vocabulary_are_listed_up_to_five():
    assert refused([1, 50, -1], GREEDY) == "prompt 0 has token ids outside the vocabulary [0, 50): [50, -1]"
    many = refused(list(range(50, 60)), SamplingParams(max_tokens=1))
    assert many.endswith("[50, 51, 52, 53, 54]")


def test_more_samples_or_beams_than_max_num_seqs():
    msg = refused([1], SamplingParams(n=4))
    assert "n=4 samples but max_num_seqs=3" in msg and "raise max_num_seqs or ask for fewer" in msg
    msg = refused([1], BeamSearchParams(beam_width=5, max_tokens=2), limits(max_num_batched_tokens=16))
    assert "beam_width=5 beams but max_num_seqs=3" in msg and "raise max_num_seqs" in msg


def test_prompt_plus_max_tokens_over_max_model_len():
    msg = refused([1] * 5, SamplingParams(max_tokens=16), index=2)
    assert msg == "prompt 2: 5 prompt tokens + max_tokens 16 = 21 exceeds max_model_len 20"
    msg = refused([1] * 5, BeamSearchParams(beam_width=2, max_tokens=16))
    assert "= 21 exceeds max_model_len 20" in msg


def test_beam_search_needs_a_layout_that_forks():
    msg = refused([1], BeamSearchParams(beam_width=2, max_tokens=2), limits(can_fork=False))
    assert msg == "beam search shares blocks between beams: it needs kv_layout='paged'"


def test_beam_width_over_max_num_batched_tokens():
    lim = limits(max_num_seqs=8, max_num_batched_tokens=4)
    msg = refused([1], BeamSearchParams(beam_width=5, max_tokens=2), lim)
    assert msg == "beam_width 5 > max_num_batched_tokens 4: the beams of a prompt step together"
    check_request([1], BeamSearchParams(beam_width=4, max_tokens=2), 0, lim)


def test_stop_strings_need_a_tokenizer():
    msg = refused([1], SamplingParams(stop=["\n"]))
    assert msg == "prompt 0: stop strings need a tokenizer; this model has none (use stop_token_ids)"
    check_request([1], SamplingParams(stop=["\n"]), 0, limits(has_tokenizer=True))


def test_stop_token_ids_outside_the_vocabulary():
    msg = refused([1], SamplingParams(stop_token_ids=[3, 50, 70]))
    assert msg == "prompt 0: stop_token_ids outside the vocabulary [0, 50): [50, 70]"


def test_kv_room_is_asked_with_the_total_and_the_sequences_and_its_reason_is_said():
    calls = []

    def room(tokens, seqs):
        calls.append((tokens, seqs))
        return "needs 9 blocks of 4 tokens but the whole pool has 8"

    lim = limits(kv_room=room)
    msg = refused([1, 2, 3], SamplingParams(n=2, max_tokens=5), lim, index=1)
    assert msg == "prompt 1 needs 9 blocks of 4 tokens but the whole pool has 8: it could never run"
    refused([1, 2], BeamSearchParams(beam_width=3, max_tokens=6), lim)
    # samples may run one at a time (asked as 1 sequence); a beam search holds every beam's
    assert calls == [(8, 1), (8, 3)]


def test_the_first_problem_is_the_one_reported():
    # empty before vocabulary, vocabulary before n, n before length
    assert refused([], SamplingParams(n=9, max_tokens=100)) == "prompt 0 is empty"
    assert "outside the vocabulary" in refused([99], SamplingParams(n=9, max_tokens=100))
    assert "max_num_seqs=3" in refused([1], SamplingParams(n=9, max_tokens=100))
