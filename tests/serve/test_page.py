"""The projector page and /try in headless Chromium, driven by Playwright (as tests/browser/ does).

The page shows the pool, and its picture changes while requests run; /try sends a student's
text, shows the answer, and outlines that student's blocks. Needs Chromium (Debian: ``apt-get
install chromium``, or ``MINIPAGED_CHROMIUM``) and playwright; every wait is bounded.
"""

from __future__ import annotations

import threading

import httpx
import pytest
from serve.harness import ENGINE, HANG, ServerThread, recording_page, together, wait_idle

from minipaged import LLM
from minipaged.serve.app import create_app
from minipaged.tiny import task

pytestmark = [pytest.mark.browser, pytest.mark.slow]
STUDENTS = 6
PREAMBLE = "You copy the text after the marker, exactly. " * 3  # 135 chars: 8 shared blocks


@pytest.fixture(scope="module")
def classroom():
    app = create_app(LLM(**ENGINE), model_name="tiny-copy", preamble=PREAMBLE, join_code="ROOM42", loopback=False)
    with ServerThread(app) as s:
        yield s


def states(page) -> list[str]:
    return page.eval_on_selector_all("#pool rect", "rects => rects.map(r => r.dataset.state)")


def first_drawn(page, condition: str) -> dict:
    """The first frame the page drew (``window.drawn``, see harness.py) for which the JS
    ``condition`` on ``f`` holds, waiting for it: every frame is recorded as it is drawn, so one
    that the next frame replaced within milliseconds is still found."""
    page.wait_for_function(f"window.drawn.some((f) => {condition})", polling=100)
    return page.evaluate(f"window.drawn.find((f) => {condition})")


def test_the_projector_shows_the_pool_and_its_picture_changes_while_requests_run(browser, classroom):
    page = recording_page(browser)
    page.goto(f"{classroom.url}/?code=ROOM42")
    page.wait_for_function("document.querySelectorAll('#pool rect').length > 0")
    assert len(states(page)) == ENGINE["num_kvcache_blocks"]
    idle = states(page)
    assert set(idle) == {"free"}
    assert "free" in page.inner_text("#legend") and "shared" in page.inner_text("#legend")

    def students():
        with httpx.Client(timeout=HANG, headers={"Authorization": "Bearer ROOM42"}) as c:
            threads = [
                threading.Thread(
                    target=c.post,
                    args=(f"{classroom.url}/v1/completions",),
                    kwargs={"json": {"prompt": f"student {i}", "max_tokens": 120, "ignore_eos": True, "user": f"s{i}"}},
                )
                for i in range(STUDENTS)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

    sender = threading.Thread(target=students)
    frame_before = int(page.get_attribute("body", "data-frame"))
    with together(classroom, STUDENTS):  # the six run at once, however late the last is sent
        sender.start()
        # six students share the preamble's blocks: one frame shows shared blocks and the requests
        # running on them (read together, from the frame drawn: the requests may be done a few frames on)
        during = first_drawn(page, "f.states.includes('shared') && f.running >= 1")
        assert during["frame"] > frame_before
        assert during["states"] != idle and "used" in during["states"]
        # ... and then the picture changes again
        page.wait_for_function(f"Number(document.body.dataset.frame) > {frame_before + 3}")
        assert "tokens / s" in page.inner_text("#figures")
        sender.join(HANG)
        assert not sender.is_alive(), "hang guard: the students' requests did not end"
    wait_idle(classroom, ENGINE["num_kvcache_blocks"], {"Authorization": "Bearer ROOM42"})
    page.wait_for_function("![...document.querySelectorAll('#pool rect')].some(r => r.dataset.state === 'used')")
    after = states(page)
    assert "cached" in after and "used" not in after  # the preamble's blocks stay cached, free
    page.close()


def test_try_sends_a_students_text_and_outlines_their_blocks(browser, classroom):
    page = recording_page(browser)
    page.goto(f"{classroom.url}/try?code=ROOM42")
    page.wait_for_function("document.querySelectorAll('#mine-pool rect').length > 0")
    assert "preamble" in page.inner_text("#preamble-note")
    text = "my blocks are outlined on the pool"
    page.fill("#name", "ana")
    page.fill("#text", text)
    page.fill("#max-tokens", "60")
    page.click("#send")
    page.wait_for_function(f"document.getElementById('answer').textContent === {text!r}")
    assert task.expected_completion(text) == page.inner_text("#answer")
    # while it ran, a frame drawn on the pool outlined this student's blocks (and only theirs)
    mine = first_drawn(page, "f.mine > 0")
    assert mine["mine"] == sum(state in ("used", "shared") for state in mine["states"])
    page.close()


def test_a_page_without_the_join_code_is_refused(browser, classroom):
    page = browser.new_page()
    response = page.goto(f"{classroom.url}/")
    assert response.status == 401 and "join code" in page.content()
    page.close()
