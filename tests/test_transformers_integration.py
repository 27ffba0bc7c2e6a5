"""The transformers instrumentor on a real, tiny, randomly initialised Llama: no download, no tokenizer.

Every expected value comes from an uninstrumented generate() run or from the inputs, never from our code.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from metric_capture import MetricCapture  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402
from transformers import GenerationMixin, LlamaConfig, LlamaForCausalLM, StoppingCriteria  # noqa: E402
from transformers.generation.streamers import BaseStreamer  # noqa: E402

from otel_llm import RequestTracker, semconv  # noqa: E402
from otel_llm.integrations.transformers import TransformersInstrumentor  # noqa: E402

PAD, BOS, EOS = 0, 1, 2
MAX_NEW = 6


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=128,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    return LlamaForCausalLM(config).eval()


class Telemetry:
    """SDK providers with in-memory exporters, and the instrumentor switched on against them."""

    def __init__(self, tracker_cls: type[RequestTracker] = RequestTracker) -> None:
        self.spans = InMemorySpanExporter()
        self.metrics = MetricCapture()  # a plain InMemoryMetricReader, as a user would set up
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.meter_provider = self.metrics.meter_provider
        self.tracker = tracker_cls(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, model="tiny-llama"
        )
        self.instrumentor = TransformersInstrumentor()
        self.instrumentor.instrument(tracker=self.tracker)

    def requests(self) -> list:
        self.tracker.force_flush()
        return [s for s in self.spans.get_finished_spans() if s.name == semconv.SPAN_REQUEST]

    def children(self, request) -> dict[str, list]:
        out: dict[str, list] = {}
        for span in self.spans.get_finished_spans():
            if span.parent is not None and span.parent.span_id == request.context.span_id:
                out.setdefault(span.name, []).append(span)
        return out

    def histogram_count(self, name: str) -> int:
        self.tracker.force_flush()
        data = self.metrics.get_metrics_data()
        total = 0
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        total += sum(point.count for point in metric.data.data_points)
        return total


@pytest.fixture
def telemetry():
    made: list[Telemetry] = []

    def make(tracker_cls: type[RequestTracker] = RequestTracker) -> Telemetry:
        made.append(Telemetry(tracker_cls))
        return made[-1]

    yield make
    for t in made:
        t.instrumentor.uninstrument()
        t.metrics.shutdown()


def prompt(*lengths: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts of the given lengths and their attention mask."""
    gen = torch.Generator().manual_seed(sum(lengths))
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(3, 128, (n,), generator=gen)
        mask[row, width - n :] = 1
    return ids, mask


def test_plain_generate_is_one_request_trace(model, telemetry):
    ids, _ = prompt(5)
    t = telemetry()
    out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
    [request] = t.requests()
    generated = out.shape[1] - ids.shape[1]
    assert request.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == 5
    assert request.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == generated == MAX_NEW
    assert tuple(request.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == (semconv.REASON_LENGTH,)
    assert request.attributes[gen_ai.GEN_AI_REQUEST_MAX_TOKENS] == MAX_NEW
    assert gen_ai.GEN_AI_REQUEST_TEMPERATURE not in request.attributes  # greedy: no sampling settings
    phases = t.children(request)
    assert {name: len(spans) for name, spans in phases.items()} == {
        semconv.SPAN_QUEUE: 1,
        semconv.SPAN_PREFILL: 1,
        semconv.SPAN_DECODE: 1,
    }
    assert t.histogram_count(semconv.METRIC_TTFT) == 1
    assert t.histogram_count(semconv.METRIC_TPOT) == 1  # more than one output token


def test_batched_generate_is_one_trace_per_row(model, telemetry):
    lengths = (3, 7, 5)
    ids, mask = prompt(*lengths)
    t = telemetry()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
    requests = t.requests()
    assert len(requests) == 3
    assert len({r.context.trace_id for r in requests}) == 3
    assert len({r.attributes[semconv.LLM_REQUEST_ID] for r in requests}) == 3
    by_prompt = sorted(requests, key=lambda r: r.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS])
    assert [r.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] for r in by_prompt] == sorted(lengths)
    for r in requests:
        assert r.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == out.shape[1] - ids.shape[1]
    assert t.histogram_count(semconv.METRIC_TTFT) == 3


def test_row_that_emits_eos_early_finishes_with_stop(model, telemetry):
    lengths = (4, 6, 5)
    ids, mask = prompt(*lengths)
    new = 8
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False)[:, ids.shape[1] :]
    # Pick a token that one row emits before its last step and the other rows never emit: declared as
    # end-of-sequence, it stops exactly that row early and leaves the others running.
    choice = None
    for row in range(3):
        others = {tok for r in range(3) if r != row for tok in plain[r].tolist()}
        for step, tok in enumerate(plain[row].tolist()[:-1]):
            if tok not in others and tok not in plain[row].tolist()[:step]:
                choice = (row, step, tok)
                break
        if choice:
            break
    assert choice is not None, "the random model produced no usable token; change the seed"
    row, step, eos = choice

    t = telemetry()
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=new, do_sample=False, eos_token_id=eos, pad_token_id=PAD
    )
    assert out[row, ids.shape[1] + step].item() == eos  # same tokens as the uninstrumented run
    requests = {r.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS]: r for r in t.requests()}
    early = requests.pop(lengths[row])
    assert tuple(early.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == (semconv.REASON_STOP,)
    assert early.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == step + 1
    for other in requests.values():
        assert tuple(other.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == (semconv.REASON_LENGTH,)
        assert other.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == new
        assert early.end_time < other.end_time  # it finished at its eos step, not when generate() returned


def test_assisted_decoding_is_one_request_with_multi_token_steps(model, telemetry):
    draft = LlamaForCausalLM(model.config).eval()
    draft.load_state_dict(model.state_dict())  # an identical draft: its guesses are accepted in bulk
    ids, _ = prompt(5)
    new = 8
    plain = model.generate(ids, max_new_tokens=new, do_sample=False)
    t = telemetry()
    out = model.generate(ids, max_new_tokens=new, do_sample=False, assistant_model=draft)
    assert torch.equal(out, plain)
    [request] = t.requests()  # the draft model's own generate() calls are part of this request
    assert request.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == new
    assert tuple(request.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == (semconv.REASON_LENGTH,)
    assert t.histogram_count(semconv.METRIC_TTFT) == 1


def test_each_returned_sequence_is_a_request(model, telemetry):
    lengths = (2, 6)
    ids, mask = prompt(*lengths)
    t = telemetry()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=True, num_return_sequences=2)
    requests = t.requests()
    assert len(requests) == out.shape[0] == 4
    assert sorted(r.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] for r in requests) == [2, 2, 6, 6]
    assert {r.attributes[gen_ai.GEN_AI_REQUEST_CHOICE_COUNT] for r in requests} == {2}


class Collect(BaseStreamer):
    def __init__(self) -> None:
        self.chunks: list[list[int]] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        self.chunks.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.ended = True


def test_streaming_keeps_working_and_is_traced(model, telemetry):
    ids, _ = prompt(6)
    plain = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
    t = telemetry()
    streamer = Collect()
    out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, streamer=streamer)
    assert torch.equal(out, plain)
    assert streamer.ended
    assert streamer.chunks[0] == ids[0].tolist()  # the prompt comes first, then one token per step
    assert [tok for chunk in streamer.chunks[1:] for tok in chunk] == plain[0, ids.shape[1] :].tolist()
    [request] = t.requests()
    assert request.attributes[gen_ai.GEN_AI_REQUEST_STREAM] is True
    assert request.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == len(streamer.chunks) - 1


def test_sampling_settings_become_request_attributes(model, telemetry):
    ids, _ = prompt(4)
    t = telemetry()
    model.generate(ids, max_new_tokens=3, do_sample=True, temperature=0.7, top_p=0.9, top_k=5)
    [request] = t.requests()
    assert request.attributes[gen_ai.GEN_AI_REQUEST_TEMPERATURE] == pytest.approx(0.7)
    assert request.attributes[gen_ai.GEN_AI_REQUEST_TOP_P] == pytest.approx(0.9)
    assert request.attributes[gen_ai.GEN_AI_REQUEST_TOP_K] == 5
    assert request.attributes[gen_ai.GEN_AI_REQUEST_MAX_TOKENS] == 3


class Boom(StoppingCriteria):
    """A user criterion that fails on the third step: generate() itself raises."""

    def __init__(self) -> None:
        self.calls = 0
        self.error = RuntimeError("boom")

    def __call__(self, input_ids, scores, **kwargs):
        self.calls += 1
        if self.calls == 3:
            raise self.error
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def test_generate_error_finishes_requests_with_error_and_reraises(model, telemetry):
    ids, mask = prompt(3, 4)
    t = telemetry()
    boom = Boom()
    with pytest.raises(RuntimeError) as raised:
        model.generate(
            ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, stopping_criteria=[boom]
        )
    assert raised.value is boom.error
    requests = t.requests()
    assert len(requests) == 2
    for r in requests:
        assert r.status.status_code is StatusCode.ERROR
        assert tuple(r.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == (semconv.REASON_ERROR,)
        assert r.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 2  # two steps completed before the failure


class BrokenTracker(RequestTracker):
    """Fault injection: a tracker whose per-step hook fails, standing in for any telemetry bug."""

    def tokens(self, *args, **kwargs):
        raise RuntimeError("telemetry bug")


def test_telemetry_failure_never_breaks_generate(model, telemetry, caplog):
    ids, _ = prompt(5)
    plain = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
    telemetry(BrokenTracker)
    with caplog.at_level("WARNING", logger="otel_llm.integrations.transformers"):
        out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
        again = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
    assert torch.equal(out, plain)
    assert torch.equal(again, plain)
    assert len([r for r in caplog.records if "step callback failed" in r.getMessage()]) == 1


def test_uninstrument_restores_generate_and_records_nothing(model, telemetry):
    original = GenerationMixin.generate
    t = telemetry()
    assert GenerationMixin.generate is not original
    wrapped = GenerationMixin.generate
    TransformersInstrumentor().instrument(tracker=t.tracker)  # a second instrument() is a no-op
    assert GenerationMixin.generate is wrapped
    t.instrumentor.uninstrument()
    assert GenerationMixin.generate is original
    ids, _ = prompt(5)
    model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
    assert t.requests() == []
    assert t.histogram_count(semconv.METRIC_TTFT) == 0


def test_instrument_rejects_a_tracker_with_providers(telemetry):
    with pytest.raises(ValueError, match="either tracker="):
        TransformersInstrumentor().instrument(tracker=object(), tracer_provider=TracerProvider())
    with pytest.raises(TypeError, match="RequestTracker"):
        TransformersInstrumentor().instrument(tracker=object())
