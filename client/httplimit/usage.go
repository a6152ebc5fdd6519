package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice/client"
)

// ResponseCost says where a rule finds what a request cost once its
// response is done: a response header or trailer holding a whole number,
// such as the tokens an LLM response used. A rule with one is a budget
// spent after the fact: a request goes through while the budget is below
// its limit (a usage peek: nothing recorded), and when the handler
// returns, the cost it reported is recorded as usage (client.Check.Usage),
// even if it takes the budget over its limit; the requests after it then
// wait until the window has room again.
type ResponseCost struct {
	name    string // canonical header name
	trailer bool
}

// ResponseHeader reads the cost from a response header that the handler
// sets before it writes the body.
func ResponseHeader(name string) ResponseCost {
	return ResponseCost{name: http.CanonicalHeaderKey(name)}
}

// ResponseTrailer reads the cost from a response trailer, set once the
// body is written (announced in the Trailer header, or set with
// http.TrailerPrefix): what a streamed response knows only at its end.
func ResponseTrailer(name string) ResponseCost {
	return ResponseCost{name: http.CanonicalHeaderKey(name), trailer: true}
}

// ParseResponseCost parses "response-header:NAME" or
// "response-trailer:NAME".
func ParseResponseCost(spec string) (ResponseCost, error) {
	kind, name, _ := strings.Cut(spec, ":")
	if name == "" || strings.ContainsAny(name, " \t\r\n:") {
		return ResponseCost{}, fmt.Errorf("httplimit: response cost %q: want response-header:NAME or response-trailer:NAME", spec)
	}
	switch kind {
	case "response-header":
		return ResponseHeader(name), nil
	case "response-trailer":
		return ResponseTrailer(name), nil
	}
	return ResponseCost{}, fmt.Errorf("httplimit: response cost %q: want response-header:NAME or response-trailer:NAME", spec)
}

// IsZero reports whether c is the zero ResponseCost (the rule's cost is
// known when the request arrives).
func (c ResponseCost) IsZero() bool { return c.name == "" }

// String is c as ParseResponseCost reads it.
func (c ResponseCost) String() string {
	switch {
	case c.name == "":
		return ""
	case c.trailer:
		return "response-trailer:" + c.name
	}
	return "response-header:" + c.name
}

// read returns the cost in the response header h once the handler
// returned: 0 without a value.
func (c ResponseCost) read(h http.Header) (int64, error) {
	v := h.Get(c.name)
	if v == "" && c.trailer {
		v = h.Get(http.TrailerPrefix + c.name)
	}
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("httplimit: %s: %q is not a count of hits (a whole number, 0 or more)", c, clip(v))
	}
	return n, nil
}

func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}

// UsageReport is a cost reported once a response was done.
type UsageReport struct {
	// Rule is the rule, Key the Sluice key it counted under.
	Rule *Rule
	Key  string
	// Cost is the cost the response reported; 0 if it reported none.
	Cost int64
	// Decision is Sluice's answer to the report: Allowed when the cost
	// fitted (it is recorded either way).
	Decision client.Decision
	// Err is why the cost could not be read or reported, if so.
	Err error
}

// reportTimeout bounds a report when the client's own deadline is shorter:
// the response is done, and a report lost is budget not counted.
const reportTimeout = time.Second

// Report records what the response of a request that Decide let through
// cost, for the rules with a ResponseCost, reading h (the response's
// header map, after the handler returned: trailers included). It calls
// Config.ObserveUsage for each, and returns what went wrong. ServeNext and
// Wrap call it; call it yourself when you use Decide or Serve.
func (l *Limiter) Report(ctx context.Context, res *Result, h http.Header) error {
	if !res.Allowed {
		return nil
	}
	var errs []error
	for i := range res.Rules {
		rr := &res.Rules[i]
		if rr.Rule.ResponseCost.IsZero() {
			continue
		}
		rep := UsageReport{Rule: rr.Rule, Key: rr.Key}
		rep.Cost, rep.Err = rr.Rule.ResponseCost.read(h)
		if rep.Err == nil && rep.Cost > 0 {
			c := l.check(rr.Rule, "")
			c.Key, c.Peek, c.Cost, c.OnFailure = rr.Key, false, rep.Cost, client.FailOpen
			rep.Decision, rep.Err = l.cfg.Client.Check(context.WithoutCancel(ctx), c, client.WithTimeout(reportTimeout))
		}
		if rep.Err != nil {
			errs = append(errs, rep.Err)
			if ok, dropped := l.logs[l.ruleIndex(rr.Rule)].allow(); ok {
				l.log.Warn("httplimit: the response's cost was not recorded", "rule", rr.Rule.Name, "key", quoteKey(rr.Key), "err", rep.Err, "not_logged", dropped)
			}
		}
		if l.cfg.ObserveUsage != nil {
			l.cfg.ObserveUsage(&rep)
		}
	}
	return errors.Join(errs...)
}

// ServeNext decides r (as Serve), serves it with next if it is allowed,
// and then reports the costs its response carried (Report). It is what
// Wrap does. It first puts r's path in CleanPath's form, which next then
// receives too, so that the rules and next see the same path; a path that
// CleanPath refuses as ambiguous is answered 400 (BadPath), and reaches
// neither Sluice nor next.
func (l *Limiter) ServeNext(w http.ResponseWriter, r *http.Request, next http.Handler) {
	r, err := CleanRequest(r)
	if err != nil {
		BadPath(w, err)
		return
	}
	res := l.Decide(r)
	if !l.respond(w, r, &res) {
		return
	}
	next.ServeHTTP(w, r)
	if l.usage {
		// The body is written: send it on before the report's round trip.
		_ = http.NewResponseController(w).Flush()
		_ = l.Report(r.Context(), &res, w.Header())
	}
}
