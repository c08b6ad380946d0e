package e2e

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sample is one scrape: series ("name{a="x",b="y"}", labels sorted) → value.
type sample map[string]float64

// parseMetrics reads the Prometheus text exposition format: counters and
// gauges are all the suite needs (histogram lines parse as series too).
func parseMetrics(r io.Reader) sample {
	s := sample{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		var name, labels, rest string
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				continue
			}
			name, labels, rest = line[:i], line[i+1:j], strings.TrimSpace(line[j+1:])
		} else {
			var ok bool
			name, rest, ok = strings.Cut(line, " ")
			if !ok {
				continue
			}
		}
		if f := strings.Fields(rest); len(f) > 0 {
			rest = f[0]
		}
		v, err := strconv.ParseFloat(rest, 64)
		if err != nil {
			continue
		}
		s[seriesKey(name, parseLabels(labels))] = v
	}
	return s
}

func parseLabels(s string) map[string]string {
	m := map[string]string{}
	for s != "" {
		k, rest, ok := strings.Cut(s, "=")
		if !ok || len(rest) == 0 || rest[0] != '"' {
			break
		}
		rest = rest[1:]
		var val strings.Builder
		i := 0
		for ; i < len(rest); i++ {
			c := rest[i]
			if c == '\\' && i+1 < len(rest) {
				i++
				switch rest[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(rest[i])
				}
				continue
			}
			if c == '"' {
				break
			}
			val.WriteByte(c)
		}
		m[strings.TrimSpace(k)] = val.String()
		s = strings.TrimLeft(rest[min(i+1, len(rest)):], ", ")
	}
	return m
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func seriesKey(name string, labels map[string]string) string {
	if len(labels) == 0 {
		return name
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + `="` + labelEscaper.Replace(labels[k]) + `"`)
	}
	b.WriteByte('}')
	return b.String()
}

// scraper scrapes every daemon's /metrics continuously and keeps, per
// daemon and incarnation, the last sample: a killed process takes its
// counters with it, so totals are sums over incarnations of their last
// values (what was counted between the last scrape and a SIGKILL is lost;
// the suite scrapes right before each kill it makes).
type scraper struct {
	daemons []*daemon
	client  *http.Client

	mu   sync.Mutex
	last map[string]map[int]sample // daemon → incarnation → last sample
	n    int
}

func newScraper(daemons ...*daemon) *scraper {
	return &scraper{daemons: daemons, client: &http.Client{Timeout: 2 * time.Second},
		last: map[string]map[int]sample{}}
}

// Run scrapes every interval until ctx ends.
func (s *scraper) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for _, d := range s.daemons {
			s.Scrape(d)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Scrape scrapes d once; a sample is kept only if the same incarnation
// ran before and after it.
func (s *scraper) Scrape(d *daemon) {
	inc := d.Current()
	if inc == 0 {
		return
	}
	resp, err := s.client.Get("http://" + d.adminAddr + "/metrics")
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return
	}
	smp := parseMetrics(resp.Body)
	if d.Current() != inc || len(smp) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last[d.name] == nil {
		s.last[d.name] = map[int]sample{}
	}
	s.last[d.name][inc] = smp
	s.n++
}

// Total sums, over d's incarnations, the series of metric name whose labels
// include want.
func (s *scraper) Total(d *daemon, name string, want map[string]string) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	total := 0.0
	for _, smp := range s.last[d.name] {
		for key, v := range smp {
			n, labels := splitKey(key)
			if n != name {
				continue
			}
			match := true
			for k, wv := range want {
				if labels[k] != wv {
					match = false
					break
				}
			}
			if match {
				total += v
			}
		}
	}
	return total
}

// Incarnations returns how many of d's incarnations were scraped.
func (s *scraper) Incarnations(d *daemon) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.last[d.name])
}

func splitKey(key string) (string, map[string]string) {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key, nil
	}
	return key[:i], parseLabels(key[i+1 : len(key)-1])
}
