package main

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// jsonOptions print every field under its proto name, so scripts see the
// same fields whatever their values.
var jsonOptions = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// printJSON writes m as indented protojson. The indentation is redone with
// encoding/json because protojson's own whitespace is deliberately
// unstable.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := jsonOptions.Marshal(m)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err = w.Write(buf.Bytes())
	return err
}

// newTable returns a writer aligning tab-separated columns; Flush it.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// timeLayout is how times are shown to people: UTC, milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

func fmtTime(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(timeLayout)
}

func fmtDuration(d *durationpb.Duration) string {
	if d == nil {
		return "-"
	}
	return d.AsDuration().Round(time.Millisecond).String()
}

func fmtBool(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// fmtText makes free text fit in one table cell.
func fmtText(s string) string {
	return strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}
