package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the server's Prometheus metrics, all named loom_*.
type metrics struct {
	requests       *prometheus.CounterVec // by endpoint and HTTP status code
	finished       *prometheus.CounterVec // by finish reason
	promptTokens   prometheus.Counter
	genTokens      prometheus.Counter
	ttft           prometheus.Histogram
	itl            prometheus.Histogram
	e2e            prometheus.Histogram
	inFlight       prometheus.Gauge
	engineSnapshot *engineCollector
}

// latencyBuckets cover 1 ms to about a minute.
var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40, 80}

func newMetrics(reg prometheus.Registerer, eng func() Engine) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loom_requests_total", Help: "HTTP requests to the API, by endpoint and status code.",
		}, []string{"endpoint", "code"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loom_request_finished_total", Help: "Generation requests that ended, by finish reason (stop, length, cancelled, error).",
		}, []string{"finish_reason"}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loom_prompt_tokens_total", Help: "Prompt tokens of the requests submitted to the engine.",
		}),
		genTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loom_generation_tokens_total", Help: "Tokens generated.",
		}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "loom_time_to_first_token_seconds", Help: "Time from a request's arrival to its first generated token.", Buckets: latencyBuckets,
		}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "loom_inter_token_latency_seconds", Help: "Time between two consecutive generated tokens of a request.", Buckets: latencyBuckets,
		}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "loom_e2e_request_latency_seconds", Help: "Time from a request's arrival to its last token.", Buckets: latencyBuckets,
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "loom_requests_in_flight", Help: "Generation requests admitted to the engine and not yet finished.",
		}),
	}
	m.engineSnapshot = &engineCollector{eng: eng}
	for _, c := range []prometheus.Collector{m.requests, m.finished, m.promptTokens, m.genTokens, m.ttft, m.itl, m.e2e, m.inFlight, m.engineSnapshot} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// engineCollector reports the engine's Stats, read once per scrape; nothing while the
// model loads (eng returns nil).
type engineCollector struct {
	eng func() Engine
}

var (
	descRunning = prometheus.NewDesc("loom_requests_running", "Requests in the engine's running batch.", nil, nil)
	descQueue   = prometheus.NewDesc("loom_queue_depth", "Requests waiting to start: in the engine's queue plus those it holds for a slot (--max-concurrent).", nil, nil)
	descKVUsed  = prometheus.NewDesc("loom_kv_cache_blocks_used", "Paged KV cache blocks in use.", nil, nil)
	descKVTotal = prometheus.NewDesc("loom_kv_cache_blocks_total", "Paged KV cache blocks in all.", nil, nil)
	descKVUse   = prometheus.NewDesc("loom_kv_cache_usage_ratio", "Fraction of the paged KV cache in use (0 to 1).", nil, nil)
	descSteps   = prometheus.NewDesc("loom_engine_steps_total", "Engine steps run.", nil, nil)
	descPreempt = prometheus.NewDesc("loom_engine_preemptions_total", "Requests preempted for lack of KV cache blocks.", nil, nil)
	descAhead   = prometheus.NewDesc("loom_engine_ahead_steps_total", "Engine steps launched before the previous step's tokens reached the host.", nil, nil)
	descEngGen  = prometheus.NewDesc("loom_engine_generated_tokens_total", "Tokens the engine generated (including those of requests cancelled later).", nil, nil)
	descEngProm = prometheus.NewDesc("loom_engine_prompt_tokens_total", "Prompt tokens the engine computed (including recomputation after preemption).", nil, nil)
	descStepSec = prometheus.NewDesc("loom_engine_step_seconds_total", "Time the engine spent in steps.", nil, nil)
	descModSec  = prometheus.NewDesc("loom_engine_model_seconds_total", "Time the engine's steps spent running the model (inputs, executables, logits).", nil, nil)
	descSampSec = prometheus.NewDesc("loom_engine_sample_seconds_total", "Time the engine's steps spent choosing tokens.", nil, nil)
	descDevSec  = prometheus.NewDesc("loom_engine_device_seconds_total", "GPU time of the model runs of the engine's steps (0 on the CPU).", nil, nil)
	descKVCache = prometheus.NewDesc("loom_kv_cache_blocks_cached", "Paged KV cache blocks no request holds that keep a cached prefix (evicted when needed; not in use).", nil, nil)
	descHitTok  = prometheus.NewDesc("loom_prefix_cache_hit_tokens_total", "Prompt tokens taken from the prefix cache instead of computed (on admission and after preemption).", nil, nil)
	descCompTok = prometheus.NewDesc("loom_engine_computed_tokens_total", "Tokens the engine's steps ran through the model: prompts past their cached prefix, recomputation, decodes.", nil, nil)
)

// Describe implements prometheus.Collector.
func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRunning, descQueue, descKVUsed, descKVTotal, descKVUse, descSteps, descPreempt, descAhead, descEngGen, descEngProm, descStepSec, descModSec, descSampSec, descDevSec, descKVCache, descHitTok, descCompTok} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	eng := c.eng()
	if eng == nil {
		return
	}
	st := eng.Stats()
	use := 0.0
	if st.KVBlocks > 0 {
		use = float64(st.KVBlocksUsed) / float64(st.KVBlocks)
	}
	constMetric(ch, descRunning, prometheus.GaugeValue, float64(st.Running))
	constMetric(ch, descQueue, prometheus.GaugeValue, float64(st.Waiting))
	constMetric(ch, descKVUsed, prometheus.GaugeValue, float64(st.KVBlocksUsed))
	constMetric(ch, descKVTotal, prometheus.GaugeValue, float64(st.KVBlocks))
	constMetric(ch, descKVUse, prometheus.GaugeValue, use)
	constMetric(ch, descSteps, prometheus.CounterValue, float64(st.StepsTotal))
	constMetric(ch, descPreempt, prometheus.CounterValue, float64(st.PreemptionsTotal))
	constMetric(ch, descAhead, prometheus.CounterValue, float64(st.AheadStepsTotal))
	constMetric(ch, descEngGen, prometheus.CounterValue, float64(st.GeneratedTokensTotal))
	constMetric(ch, descEngProm, prometheus.CounterValue, float64(st.PromptTokensTotal))
	constMetric(ch, descStepSec, prometheus.CounterValue, st.StepSeconds)
	constMetric(ch, descModSec, prometheus.CounterValue, st.ModelSeconds)
	constMetric(ch, descSampSec, prometheus.CounterValue, st.SampleSeconds)
	constMetric(ch, descDevSec, prometheus.CounterValue, st.DeviceSeconds)
	constMetric(ch, descKVCache, prometheus.GaugeValue, float64(st.KVBlocksCached))
	constMetric(ch, descHitTok, prometheus.CounterValue, float64(st.CachedTokensTotal))
	constMetric(ch, descCompTok, prometheus.CounterValue, float64(st.ComputedTokensTotal))
}

// countRequest records one answered HTTP request.
func (m *metrics) countRequest(endpoint string, code int) {
	m.requests.WithLabelValues(endpoint, strconv.Itoa(code)).Inc()
}

// constMetric sends one unlabelled metric; the descriptors are fixed, so it cannot fail.
func constMetric(ch chan<- prometheus.Metric, d *prometheus.Desc, t prometheus.ValueType, v float64) {
	if m, err := prometheus.NewConstMetric(d, t, v); err == nil {
		ch <- m
	}
}
