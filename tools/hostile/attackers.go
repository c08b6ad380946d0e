package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// The attackers run in a process of their own, the tool started again with
// --attack-child, so that a CPU cap can hold them to what an attacker's own
// machines would spend (--attack-wrap) and the report can tell their CPU
// from the legitimate clients'. The protocol on the child's stdin and
// stdout: the child writes "ready" once the bomb is made; the parent writes
// "start"; the child attacks until its stdin closes, then writes its
// attackReport as one JSON line and exits 0.
const (
	childReady = "ready"
	childStart = "start"
	// childReadyWait bounds the child's start-up (making the bomb takes
	// about 1.5 s on one core; a capped child gets less).
	childReadyWait = 2 * time.Minute
)

// attackReport is what the attackers saw, nil for an attacker that was off.
type attackReport struct {
	BombBytes int         `json:"bomb_bytes"`
	Loris     *lorisStats `json:"loris,omitempty"`
	BadTokens *rateStats  `json:"bad_tokens,omitempty"`
	Flood     *floodStats `json:"flood,omitempty"`
	Bombs     *rateStats  `json:"bombs,omitempty"`
	Invented  *rateStats  `json:"invented,omitempty"`
	Idle      []idleStats `json:"idle,omitempty"`
}

// attack runs every attacker that is on until ctx ends.
func attack(ctx context.Context, c config, bomb []byte) attackReport {
	r := attackReport{BombBytes: len(bomb)}
	var wg sync.WaitGroup
	api, _ := hostPort(c.url) // validated: an http(s) URL
	if c.slowloris > 0 {
		wg.Go(func() { s := slowloris(ctx, c.dialer(fromSlowloris), api, c.slowloris); r.Loris = &s })
	}
	if c.badTokenRate > 0 {
		wg.Go(func() { s := badTokens(ctx, c); r.BadTokens = &s })
	}
	if c.floodFactor > 0 {
		wg.Go(func() { s := flood(ctx, c, c.tenantConcurrency*c.floodFactor); r.Flood = &s })
	}
	if c.bombRate > 0 {
		wg.Go(func() { s := bombs(ctx, c, bomb); r.Bombs = &s })
	}
	if c.inventedRate > 0 {
		wg.Go(func() { s := inventedMethods(ctx, c); r.Invented = &s })
	}
	if c.idleConns > 0 {
		targets := []idleTarget{{name: "api", addr: api, path: notesPath + "?limit=1"}}
		if c.adminURL != "" {
			admin, _ := hostPort(c.adminURL)
			targets = append(targets, idleTarget{name: "admin", addr: admin, path: "/healthz"})
		}
		wg.Go(func() { r.Idle = idleHost(ctx, c.dialer(fromIdle), targets, c.idleConns) })
	}
	wg.Wait()
	return r
}

// runAttackChild is the child's whole life (see the protocol above).
func runAttackChild(ctx context.Context, c config, stdin io.Reader, stdout io.Writer) error {
	var bomb []byte
	if c.bombRate > 0 {
		var err error
		if bomb, err = makeBomb(bombSide, bombSide); err != nil {
			return err
		}
	}
	fmt.Fprintln(stdout, childReady)
	in := bufio.NewScanner(stdin)
	if !in.Scan() || in.Text() != childStart {
		return errors.New("attack child: stdin closed or sent something else than " + childStart)
	}
	actx, stop := context.WithCancel(ctx)
	go func() {
		for in.Scan() {
		}
		stop() // stdin closed: the phase is over
	}()
	r := attack(actx, c, bomb)
	stop()
	return json.NewEncoder(stdout).Encode(r)
}

// attackProc is a started attack child.
type attackProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
}

// startAttackChild starts the child (behind c.attackWrap's command when
// set) with the parent's arguments and waits for its "ready".
func startAttackChild(ctx context.Context, c config, args []string, stderr io.Writer) (*attackProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this program to start the attackers: %w", err)
	}
	argv := append(strings.Fields(c.attackWrap), self)
	argv = append(argv, args...)
	argv = append(argv, "--attack-child", "--run-id", c.runID)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stderr = stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("attack child: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("attack child: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the attackers (%s): %w", strings.Join(argv[:len(argv)-len(args)-3], " "), err)
	}
	p := &attackProc{cmd: cmd, stdin: in, stdout: bufio.NewReader(out)}
	ready := make(chan error, 1)
	go func() {
		line, err := p.stdout.ReadString('\n')
		if err == nil && strings.TrimSpace(line) != childReady {
			err = fmt.Errorf("said %q", line)
		}
		ready <- err
	}()
	select {
	case err = <-ready:
	case <-time.After(childReadyWait):
		err = fmt.Errorf("not ready after %s", childReadyWait)
	}
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("the attack child did not start: %w", err)
	}
	return p, nil
}

// pid is the child's process id (its CPU is read from /proc).
func (p *attackProc) pid() int { return p.cmd.Process.Pid }

// start tells the child to attack.
func (p *attackProc) start() error {
	_, err := fmt.Fprintln(p.stdin, childStart)
	return err
}

// stop ends the attack and returns the child's report.
func (p *attackProc) stop() (attackReport, error) {
	var r attackReport
	_ = p.stdin.Close()
	line, rerr := p.stdout.ReadString('\n')
	werr := p.cmd.Wait()
	if rerr != nil || werr != nil {
		return r, fmt.Errorf("the attack child ended without its report: %w", errors.Join(rerr, werr))
	}
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return r, fmt.Errorf("the attack child's report: %w", err)
	}
	return r, nil
}
