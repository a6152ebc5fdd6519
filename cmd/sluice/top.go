package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/api"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// topRateSeconds is the span of the per-node rates: the last whole
// seconds, as the web UI shows them.
const topRateSeconds = 10

func (c *cli) topCommand() *cobra.Command {
	co := &clientOptions{}
	var (
		interval   time.Duration
		top        int32
		iterations int
	)
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Watch the cluster's busiest and most denied keys and each node's rates (admin token)",
		Long: `Show, refreshed every --interval, what the web UI's cluster page shows
(/ui/ on a node's --http-addr), for a terminal on a jump host: each member
with its state, share of keys, uptime, decisions, denials and errors per
second (over the last 10 whole seconds) and the latency of its decision
requests (p50 and p99 within 25%, and the longest, over the last minute);
then the keys decided most and denied most in the cluster over the last
minute, each with the node that owns it.

The node at --addr asks every live member (TrafficService.GetTraffic) and
merges their counts: any node shows the whole cluster. Each node counts the
checks it was asked, so a key is counted once whichever node was asked.
Key counts come from bounded sketches (space-saving): a count is at most
its ± above the true count, and the header of each list says how many a
key that is not listed can have had at most.

On a terminal, each refresh redraws the screen; otherwise frames follow
one another. -n 1 prints once and exits (for scripts; -o json prints the
GetTrafficResponse).`,
		Example: `  sluice top --addr sluice-0.sluice:8081 --admin-token "$TOKEN"
  sluice top -n 1 --top 5
  sluice top -n 1 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < 100*time.Millisecond {
				return fmt.Errorf("--interval %v: want at least 100ms", interval)
			}
			if top < 1 || top > 1000 {
				return fmt.Errorf("--top %d: want 1 to 1000", top)
			}
			cl, err := co.dial()
			if err != nil {
				return err
			}
			defer cl.close()
			out := cmd.OutOrStdout()
			clear := isTerminal(out) && !co.json()
			ticker := time.NewTicker(interval)
			defer ticker.Stop()
			for i := 0; iterations == 0 || i < iterations; i++ {
				if i > 0 {
					select {
					case <-cmd.Context().Done():
						return nil
					case <-ticker.C:
					}
				}
				var frame bytes.Buffer
				if clear {
					frame.WriteString("\x1b[H\x1b[2J")
				} else if i > 0 && !co.json() {
					frame.WriteString("\n")
				}
				err := cl.topFrame(cmd.Context(), &frame, top, co.json())
				if err != nil && iterations == 1 {
					return err
				}
				if err != nil {
					fmt.Fprintf(&frame, "%s  %v\n", time.Now().UTC().Format(timeLayout), err)
				}
				if _, err := out.Write(frame.Bytes()); err != nil {
					return err
				}
			}
			return nil
		},
	}
	co.register(cmd.Flags())
	fs := cmd.Flags()
	fs.Var(newDurationValue(&interval, 2*time.Second), "interval", "time between refreshes")
	fs.Int32Var(&top, "top", 10, "keys in each list (1 to 1000)")
	fs.IntVarP(&iterations, "iterations", "n", 0, "refresh this many times, then exit (0: until interrupted)")
	return cmd
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

// topFrame asks for the cluster's traffic and members and writes one frame.
func (c *client) topFrame(ctx context.Context, w io.Writer, top int32, asJSON bool) error {
	cctx, cancel := c.callContext(ctx)
	defer cancel()
	tr, err := sluicepb.NewTrafficServiceClient(c.conn).GetTraffic(cctx, &sluicepb.GetTrafficRequest{Top: top, Seconds: topRateSeconds + 1})
	if err != nil {
		return c.callError(err)
	}
	if asJSON {
		return printJSON(w, tr)
	}
	members, err := c.admin.ListMembers(cctx, &sluicepb.ListMembersRequest{})
	if err != nil {
		return c.callError(err)
	}
	return printTop(w, c.opts.addr, members, tr)
}

// nodeRates are a node's rates over its last whole seconds.
type nodeRates struct{ decisions, denials, errors float64 }

func rates(n *sluicepb.NodeTraffic) nodeRates {
	whole := n.Seconds
	if len(whole) > 1 {
		whole = whole[:len(whole)-1] // the last second is partial
	}
	whole = whole[max(len(whole)-topRateSeconds, 0):]
	var r nodeRates
	if k := float64(len(whole)); k > 0 {
		for _, s := range whole {
			r.decisions += float64(s.Decisions) / k
			r.denials += float64(s.Denials) / k
			r.errors += float64(s.Errors) / k
		}
	}
	return r
}

// printTop writes one frame: a header, the members and the two top lists.
func printTop(w io.Writer, addr string, members *sluicepb.ListMembersResponse, tr *sluicepb.GetTrafficResponse) error {
	byName := make(map[string]*sluicepb.NodeTraffic)
	var total nodeRates
	var readAt time.Time
	for _, n := range tr.Nodes {
		byName[n.Name] = n
		if n.Error == "" {
			r := rates(n)
			total.decisions += r.decisions
			total.denials += r.denials
			total.errors += r.errors
			if t := n.ReadAt.AsTime(); t.After(readAt) {
				readAt = t
			}
		}
	}
	live := 0
	for _, m := range members.Members {
		if m.State == "alive" || m.State == "leaving" {
			live++
		}
	}
	fmt.Fprintf(w, "sluice top: via %s at %s, view epoch %d, %s\n", fmtText(tr.Node), fmtText(addr), tr.Epoch, readAt.UTC().Format(timeLayout))
	fmt.Fprintf(w, "%d live of %d members · %.1f decisions/s · %.1f denials/s · %.1f errors/s\n\n",
		live, len(members.Members), total.decisions, total.denials, total.errors)

	tw := newTable(w)
	fmt.Fprintln(tw, "NODE\tSTATE\tSHARE\tUPTIME\tDECISIONS/S\tDENIALS/S\tERRORS/S\tP50\tP99\tMAX")
	var errs []string
	for _, m := range members.Members {
		n := byName[m.Name]
		switch {
		case n == nil:
			fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t-\t-\t-\t-\t-\t-\t-\n", fmtText(m.Name), m.State, 100*m.Share)
		case n.Error != "":
			fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t-\t-\t-\t-\t-\t-\t-\n", fmtText(m.Name), m.State, 100*m.Share)
			errs = append(errs, fmt.Sprintf("%s: %s", fmtText(m.Name), fmtText(n.Error)))
		default:
			r := rates(n)
			up := n.ReadAt.AsTime().Sub(n.Started.AsTime()).Round(time.Second)
			l := n.GetLatency()
			fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t%s\t%.1f\t%.1f\t%.1f\t%s\t%s\t%s\n", fmtText(m.Name), m.State, 100*m.Share, up,
				r.decisions, r.denials, r.errors, fmtLatencyPB(l.GetP50()), fmtLatencyPB(l.GetP99()), fmtLatencyPB(l.GetMax()))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, e := range errs {
		fmt.Fprintf(w, "  no figures from %s\n", e)
	}
	for _, list := range []struct {
		name, noun string
		t          *sluicepb.TopKeys
	}{
		{"DECISIONS", "decisions", tr.TopDecisions},
		{"DENIALS", "denials", tr.TopDenials},
	} {
		t := list.t
		fmt.Fprintf(w, "\nTOP KEYS BY %s over the last %s: %d %s in all", list.name, t.GetWindow().AsDuration().Round(100*time.Millisecond), t.GetTotal(), list.noun)
		if t.GetFloor() > 0 {
			fmt.Fprintf(w, "; a key not listed had at most %d", t.GetFloor())
		}
		fmt.Fprintln(w)
		if len(t.GetKeys()) == 0 {
			fmt.Fprintf(w, "(no %s)\n", list.noun)
			continue
		}
		tw := newTable(w)
		fmt.Fprintf(tw, "KEY\t%s\t±\tSHARE\tOWNER\n", list.name)
		for _, k := range t.Keys {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f%%\t%s\n", api.PrintableKey(k.Key), k.Count, k.Error, 100*float64(k.Count)/float64(max(t.Total, 1)), orDash(k.Owner))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// fmtLatencyPB shows a latency of the API to the microsecond.
func fmtLatencyPB(d *durationpb.Duration) string {
	if d == nil {
		return "-"
	}
	return fmtLatency(d.AsDuration())
}
