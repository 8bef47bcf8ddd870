package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
)

// apiClient implements backend over the admin HTTP API.
type apiClient struct {
	base  *url.URL
	token string
	http  *http.Client
}

func newAPIClient(server, tokenFile string, timeout time.Duration) (*apiClient, error) {
	u, err := url.Parse(server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageErrorf("--server: %q is not a URL such as %s", server, defaultServer)
	}
	// A transport of its own, so closing it leaves no idle connections behind.
	c := &apiClient{base: u, http: &http.Client{Timeout: timeout, Transport: http.DefaultTransport.(*http.Transport).Clone()}}
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		c.token = strings.TrimSpace(string(b))
	}
	return c, nil
}

// close releases idle connections.
func (c *apiClient) close() { c.http.CloseIdleConnections() }

// remoteError is an error answer of the admin API. It matches the sentinel
// its status stands for, so the CLI treats it like the direct mode's error.
type remoteError struct {
	status int
	msg    string
}

func (e *remoteError) Error() string { return e.msg }

func (e *remoteError) Is(target error) bool {
	switch e.status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return target == schema.ErrInvalid
	case http.StatusNotFound:
		return target == ErrNotFound
	case http.StatusConflict:
		return target == ErrConflict
	case http.StatusPreconditionFailed:
		// The CLI sends only revisions (--if-revision): a stale one is
		// the conflict the direct mode reports.
		return target == ErrPreconditionFailed || target == ErrConflict
	case http.StatusUnauthorized:
		return target == ErrUnauthorized
	case http.StatusForbidden:
		return target == ErrForbidden
	case http.StatusInternalServerError:
		return target == ErrMalformedStored && strings.HasPrefix(e.msg, ErrMalformedStored.Error())
	}
	return false
}

// do sends a request and decodes the JSON answer into out.
func (c *apiClient) do(ctx context.Context, method, path string, hdr http.Header, body []byte, out any) error {
	u := c.base.JoinPath(path)
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("admin API %s: %w (is 'configd serve' running? or use --etcd-endpoints)", c.base.Host, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("admin API: reading answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e errorBody
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = fmt.Sprintf("admin API answered %s", resp.Status)
		}
		return &remoteError{status: resp.StatusCode, msg: e.Error}
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("admin API: bad answer: %w", err)
	}
	return nil
}

func (c *apiClient) list(ctx context.Context) (listView, error) {
	var v listView
	err := c.do(ctx, http.MethodGet, "/v1/providers", nil, nil, &v)
	return v, err
}

func (c *apiClient) get(ctx context.Context, name string) (providerView, error) {
	if err := schema.ValidateName(name); err != nil {
		return providerView{}, err
	}
	var v providerView
	err := c.do(ctx, http.MethodGet, "/v1/providers/"+name, nil, nil, &v)
	return v, err
}

func writeHeaders(ifRev int64, who string) http.Header {
	h := http.Header{}
	switch {
	case ifRev == 0:
		h.Set("If-None-Match", "*")
	case ifRev > 0:
		h.Set("If-Match", strconv.Quote(strconv.FormatInt(ifRev, 10)))
	}
	if who != "" {
		h.Set(actorHeader, who)
	}
	return h
}

func (c *apiClient) put(ctx context.Context, cfg schema.ProviderConfig, ifRev int64, who string) (changeView, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return changeView{}, err
	}
	body, err := schema.Encode(cfg)
	if err != nil {
		return changeView{}, err
	}
	var v changeView
	err = c.do(ctx, http.MethodPut, "/v1/providers/"+cfg.Name, writeHeaders(ifRev, who), body, &v)
	return v, err
}

func (c *apiClient) remove(ctx context.Context, name string, ifRev int64, who string) (changeView, error) {
	if err := schema.ValidateName(name); err != nil {
		return changeView{}, err
	}
	var v changeView
	err := c.do(ctx, http.MethodDelete, "/v1/providers/"+name, writeHeaders(ifRev, who), nil, &v)
	return v, err
}

func (c *apiClient) status(ctx context.Context, name string) (statusView, error) {
	if err := schema.ValidateName(name); err != nil {
		return statusView{}, err
	}
	var v statusView
	err := c.do(ctx, http.MethodGet, "/v1/providers/"+name+"/instances", nil, nil, &v)
	return v, err
}

func (c *apiClient) history(ctx context.Context, name string) ([]schema.HistoryEntry, error) {
	if err := schema.ValidateName(name); err != nil {
		return nil, err
	}
	var v []schema.HistoryEntry
	err := c.do(ctx, http.MethodGet, "/v1/providers/"+name+"/history", nil, nil, &v)
	return v, err
}

func (c *apiClient) audit(ctx context.Context, name string) (auditView, error) {
	if err := schema.ValidateName(name); err != nil {
		return auditView{}, err
	}
	var v auditView
	err := c.do(ctx, http.MethodGet, "/v1/providers/"+name+"/audit", nil, nil, &v)
	return v, err
}
