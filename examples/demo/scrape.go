package main

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// sample is one line of the Prometheus text format: a name, its labels as
// written ({a="x",b="y"}, or ""), and a value.
type sample struct {
	name, labels string
	value        float64
}

// metrics is one scrape of an instance's /metrics.
type metrics []sample

// get returns the value of the first sample named name whose labels
// include every k="v" of kv (pairs), and whether there was one.
func (m metrics) get(name string, kv ...string) (float64, bool) {
next:
	for _, s := range m {
		if s.name != name {
			continue
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if !strings.Contains(s.labels, kv[i]+`="`+kv[i+1]+`"`) {
				continue next
			}
		}
		return s.value, true
	}
	return 0, false
}

// value is get without the ok.
func (m metrics) value(name string, kv ...string) float64 {
	v, _ := m.get(name, kv...)
	return v
}

// source returns the label of sluice_member_source that is 1.
func (m metrics) source() string {
	for _, s := range m {
		if s.name == "sluice_member_source" && s.value == 1 {
			if _, after, ok := strings.Cut(s.labels, `source="`); ok {
				v, _, _ := strings.Cut(after, `"`)
				return v
			}
		}
	}
	return "-"
}

// scrape reads url in the Prometheus text format (what promhttp serves to
// a client that asks for nothing else). Only the simple lines the sluice
// collectors write are understood: no escaped quotes in label values.
func scrape(ctx context.Context, client *http.Client, url string) (metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var m metrics
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			continue
		}
		name, labels := l[:i], ""
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name, labels = l[:j], l[j:i]
		}
		m = append(m, sample{name: name, labels: labels, value: v})
	}
	return m, sc.Err()
}
