// Command devlog makes the JSON logs of Quill's processes readable for a
// person at a terminal: `make dev` pipes the api's, the relay's and the
// attachment worker's stderr through it. Each JSON line becomes one line of
// time, level, process, message and fields; any other line is copied as it
// is, so nothing a process prints is lost. The processes themselves keep
// logging JSON (SPEC §2), which is what log collectors want.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

func main() {
	// Ctrl-C reaches the whole process group; devlog stays to show the
	// processes' last lines while they shut down and ends at end of input.
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	if err := run(os.Stdin, os.Stdout, isTerminal(os.Stdout)); err != nil {
		fmt.Fprintln(os.Stderr, "devlog:", err)
		os.Exit(1)
	}
}

// maxLine bounds one log line; a longer one is copied through in pieces.
const maxLine = 1 << 20

// run copies in to out line by line, rendering JSON lines with zerolog's
// console writer. It returns the first read or write error.
func run(in io.Reader, out io.Writer, color bool) error {
	cw := zerolog.ConsoleWriter{
		Out:           out,
		NoColor:       !color,
		TimeFormat:    "15:04:05.000",
		TimeLocation:  time.Local,
		PartsOrder:    []string{zerolog.TimestampFieldName, zerolog.LevelFieldName, "process", zerolog.MessageFieldName},
		FieldsExclude: []string{"process"},
		FormatPartValueByName: func(v any, name string) string {
			if name == "process" {
				return fmt.Sprintf("%-17s", fmt.Sprint(v))
			}
			return fmt.Sprint(v)
		},
	}
	r := bufio.NewReaderSize(in, 64<<10)
	for {
		line, err := r.ReadSlice('\n')
		if len(line) > 0 {
			if werr := writeLine(cw, out, line); werr != nil {
				return werr
			}
		}
		switch {
		case err == nil, err == bufio.ErrBufferFull:
		case err == io.EOF:
			return nil
		default:
			return fmt.Errorf("read: %w", err)
		}
	}
}

func writeLine(cw zerolog.ConsoleWriter, out io.Writer, line []byte) error {
	trimmed := bytes.TrimSpace(line)
	if len(trimmed) > 1 && trimmed[0] == '{' && trimmed[len(trimmed)-1] == '}' && len(trimmed) <= maxLine {
		// The console writer refuses what is not a JSON object; such a
		// line is shown as it came.
		if _, err := cw.Write(trimmed); err == nil {
			return nil
		}
	}
	if _, err := out.Write(line); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
