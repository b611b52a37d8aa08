"""The page → Reading normalization, on hand-made pages in each engine's documented shape."""
import pytest

from hangwatch.reading import UnreadablePage, parse

VLLM_TWO_ENGINES = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.5
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 100.0
vllm:prompt_tokens_created{engine="0",model_name="tiny"} 1.76e+09
vllm:prompt_tokens_total{engine="1",model_name="tiny"} 50.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 7.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="tiny"} 3.0
vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 42.0
vllm:iteration_tokens_total_sum{engine="0",model_name="tiny"} 420.0
vllm:iteration_tokens_total_count{engine="1",model_name="tiny"} 8.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 150.0
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 4.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 2.0
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="awake"} 1.0
vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="weights_offloaded"} 0.0
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.764468e+09
"""


def test_sums_over_engine_and_model_labels():
    reading = parse(VLLM_TWO_ENGINES)
    assert reading.engine == "vllm"
    assert (reading.running, reading.waiting, reading.in_flight) == (3, 3, 6)
    assert reading.steps == 50
    assert reading.prompt_tokens == 150 and reading.generation_tokens == 7
    assert reading.prefix_cache_queries == 150
    assert reading.finished == 6
    assert reading.kv_cache_usage == 0.75
    assert reading.process_start == 1.764468e9
    assert reading.models == ("tiny",)
    assert reading.asleep is False


def test_created_series_are_not_counted_as_counters():
    page = VLLM_TWO_ENGINES.replace('vllm:prompt_tokens_total{engine="1",model_name="tiny"} 50.0\n', "")
    assert parse(page).prompt_tokens == 100


def test_counters_without_total_suffix_are_accepted():
    page = VLLM_TWO_ENGINES.replace("vllm:prompt_tokens_total{", "vllm:prompt_tokens{")
    assert parse(page).prompt_tokens == 150


def test_older_gpu_cache_usage_name_is_accepted():
    page = VLLM_TWO_ENGINES.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert parse(page).kv_cache_usage == 0.75


def test_multiprocess_start_declared_gauges_without_samples_read_as_zero():
    page = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
# TYPE vllm:kv_cache_usage_perc gauge
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 0.0
"""
    reading = parse(page)
    assert (reading.running, reading.waiting, reading.kv_cache_usage) == (0, 0, 0)
    assert reading.process_start is None


def test_asleep_when_awake_gauge_is_zero():
    page = VLLM_TWO_ENGINES.replace('sleep_state="awake"} 1.0', 'sleep_state="awake"} 0.0')
    assert parse(page).asleep is True


@pytest.mark.parametrize("bad, why", [
    ("<html><body>Bad gateway</body></html>", "no known engine"),
    ("", "no known engine"),
    ("vllm:num_requests_running{engine=\"0\",model_n", "truncated"),
    ("# TYPE vllm:num_requests_running gauge\n", "without vllm:num_requests_waiting"),
    (VLLM_TWO_ENGINES.replace("} 2.0", "} NaN"), "non-finite"),
    (VLLM_TWO_ENGINES.replace("} 0.25", "} +Inf"), "non-finite"),
    (VLLM_TWO_ENGINES.replace("} 2.0", "} two"), "not a number"),
    (VLLM_TWO_ENGINES + 'vllm:num_requests_running{engine="0",model_name="tiny"} 2.0\n', "duplicate series"),
])
def test_unreadable_pages_say_why(bad, why):
    with pytest.raises(UnreadablePage, match=why):
        parse(bad)


def test_truncated_page_missing_waiting_is_unreadable():
    page = VLLM_TWO_ENGINES[: VLLM_TWO_ENGINES.index("# TYPE vllm:num_requests_waiting")]
    with pytest.raises(UnreadablePage, match="num_requests_waiting"):
        parse(page)


def test_llamacpp_page():
    page = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 300
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 77
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 12.5
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""
    reading = parse(page)
    assert reading.engine == "llamacpp"
    assert (reading.running, reading.waiting, reading.steps) == (4, 2, 77)
    assert reading.process_start is None


def test_engine_can_be_forced_and_unknown_page_is_never_guessed():
    with pytest.raises(UnreadablePage):
        parse(VLLM_TWO_ENGINES, engine="llamacpp")


def test_an_engine_without_a_metrics_page_is_unreadable_not_a_crash():
    with pytest.raises(UnreadablePage, match="fastchat has no Prometheus page"):
        parse(VLLM_TWO_ENGINES, engine="fastchat")
