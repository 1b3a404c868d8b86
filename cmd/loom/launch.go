package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// launchOptions configure runLaunch.
type launchOptions struct {
	nproc  int           // ranks to start, >= 1
	port   int           // MASTER_PORT; 0 picks a free port
	grace  time.Duration // how long ranks may take to exit after SIGTERM before SIGKILL
	argv   []string      // the command of every rank
	stdout io.Writer     // where the ranks' stdout lines go, prefixed
	stderr io.Writer     // where their stderr lines go, prefixed
	// signals delivers the signals to forward to the ranks; nil means this process's
	// SIGINT and SIGTERM.
	signals <-chan os.Signal
}

func newLaunchCmd() *cobra.Command {
	o := launchOptions{}
	cmd := &cobra.Command{
		Use:   "launch --nproc N [--master-port P] -- COMMAND [ARG...]",
		Short: "Start N ranks of a command on this host, one per GPU (torchrun-style)",
		Long: `launch starts N processes of COMMAND on this host, as ranks 0..N-1 of one world. Each
gets RANK, WORLD_SIZE, LOCAL_RANK (its GPU), MASTER_ADDR=127.0.0.1 and MASTER_PORT in its
environment, which dist/nccl reads to bring the ranks together. Every line a rank writes is
prefixed with [rank N]. SIGINT and SIGTERM are forwarded to every rank. When a rank fails
(exits with a non-zero status or dies of a signal), the others get SIGTERM, then SIGKILL
after --grace, and launch fails naming that rank and its status.`,
		Example: "  loom launch --nproc 2 -- ./nccl.test -test.run TestMultiProcess",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.argv, o.stdout, o.stderr = args, cmd.OutOrStdout(), cmd.ErrOrStderr()
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			return runLaunch(ctx, o)
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // flags after COMMAND belong to it
	f.IntVar(&o.nproc, "nproc", 1, "number of ranks (processes) to start")
	f.IntVar(&o.port, "master-port", 0, "TCP port for the ranks' rendezvous (MASTER_PORT); 0 picks a free one")
	f.DurationVar(&o.grace, "grace", 5*time.Second, "how long ranks may take to exit after SIGTERM before they are killed")
	return cmd
}

// rankExit is how one rank ended.
type rankExit struct {
	rank  int
	err   error // from Wait
	state *os.ProcessState
}

func (e rankExit) failed() bool { return e.err != nil || !e.state.Success() }

// describe says how the rank ended: "exited with status 3", "was killed by signal
// segmentation fault".
func (e rankExit) describe() string {
	if e.state != nil {
		if ws, ok := e.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Sprintf("was killed by signal %v", ws.Signal())
		}
		if e.state.Exited() {
			return fmt.Sprintf("exited with status %d", e.state.ExitCode())
		}
	}
	return fmt.Sprintf("failed: %v", e.err)
}

// runLaunch starts the ranks, forwards signals, and stops every rank when one fails.
func runLaunch(ctx context.Context, o launchOptions) error {
	switch {
	case o.nproc < 1:
		return fmt.Errorf("launch: --nproc %d, want at least 1", o.nproc)
	case len(o.argv) == 0 || o.argv[0] == "":
		return errors.New("launch: no command (usage: loom launch --nproc N -- COMMAND [ARG...])")
	case o.port < 0 || o.port > 65535:
		return fmt.Errorf("launch: --master-port %d is not a TCP port", o.port)
	case o.grace < 0:
		return fmt.Errorf("launch: --grace %v is negative", o.grace)
	}
	if o.port == 0 {
		p, err := freeTCPPort()
		if err != nil {
			return fmt.Errorf("launch: pick a master port: %w", err)
		}
		o.port = p
	}
	sigs := o.signals
	if sigs == nil {
		ch := make(chan os.Signal, 4)
		signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(ch)
		sigs = ch
	}

	var outMu sync.Mutex // one line at a time, across ranks and streams
	procs := make([]*exec.Cmd, 0, o.nproc)
	var writers []*prefixWriter
	exits := make(chan rankExit, o.nproc)
	signalAll := func(sig syscall.Signal, exited []bool) {
		for r, c := range procs {
			if exited == nil || !exited[r] {
				signalGroup(c.Process, sig)
			}
		}
	}
	for r := range o.nproc {
		c := exec.Command(o.argv[0], o.argv[1:]...)
		c.Env = append(os.Environ(),
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(o.nproc), "LOCAL_RANK="+strconv.Itoa(r),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(o.port))
		stdout := &prefixWriter{mu: &outMu, w: o.stdout, prefix: fmt.Sprintf("[rank %d] ", r)}
		stderr := &prefixWriter{mu: &outMu, w: o.stderr, prefix: stdout.prefix}
		writers = append(writers, stdout, stderr)
		c.Stdout, c.Stderr = stdout, stderr
		c.SysProcAttr = rankProcAttr()
		c.WaitDelay = o.grace + time.Second // a grandchild holding the output open cannot block Wait
		if err := c.Start(); err != nil {
			signalAll(syscall.SIGKILL, nil)
			for range procs {
				<-exits
			}
			return fmt.Errorf("launch: start rank %d (%s): %w", r, o.argv[0], err)
		}
		procs = append(procs, c)
		go func() {
			err := c.Wait()
			exits <- rankExit{rank: r, err: err, state: c.ProcessState}
		}()
	}
	defer func() {
		for _, w := range writers {
			w.flush()
		}
	}()

	exited := make([]bool, o.nproc)
	var culprit *rankExit
	var interrupted string
	stopping := false
	var kill <-chan time.Time
	stop := func(sig syscall.Signal) {
		signalAll(sig, exited)
		if !stopping {
			stopping = true
			kill = time.After(o.grace)
		}
	}
	done := ctx.Done()
	for running := o.nproc; running > 0; {
		select {
		case e := <-exits:
			running--
			exited[e.rank] = true
			if e.failed() && !stopping {
				culprit = &e
				stop(syscall.SIGTERM)
			}
		case s := <-sigs:
			if interrupted == "" {
				interrupted = s.String()
			}
			sig, ok := s.(syscall.Signal)
			if !ok {
				sig = syscall.SIGTERM
			}
			stop(sig)
		case <-done:
			done = nil
			if interrupted == "" {
				interrupted = context.Cause(ctx).Error()
			}
			stop(syscall.SIGTERM)
		case <-kill:
			kill = nil
			signalAll(syscall.SIGKILL, exited)
		}
	}
	switch {
	case culprit != nil:
		return fmt.Errorf("launch: rank %d %s; the other ranks were stopped", culprit.rank, culprit.describe())
	case interrupted != "":
		return fmt.Errorf("launch: interrupted (%s); forwarded to every rank", interrupted)
	}
	return nil
}

// freeTCPPort asks the system for a free port on 127.0.0.1.
func freeTCPPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// prefixWriter writes whole lines to w, each preceded by prefix, under mu (shared by every
// writer of one launch, so lines never interleave). A final line without a newline is
// written by flush.
type prefixWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

// maxLine bounds a pending line: a longer one is written in pieces.
const maxLine = 64 << 10

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			if len(p.buf) >= maxLine {
				p.emit(append(p.buf, '\n'))
				p.buf = p.buf[:0]
			}
			return len(b), nil
		}
		p.emit(p.buf[:i+1])
		p.buf = p.buf[i+1:]
	}
}

func (p *prefixWriter) emit(line []byte) {
	out := make([]byte, 0, len(p.prefix)+len(line))
	out = append(append(out, p.prefix...), line...)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.w.Write(out) // the ranks' output is best effort: a closed terminal must not stop them
}

func (p *prefixWriter) flush() {
	if len(p.buf) > 0 {
		p.emit(append(p.buf, '\n'))
		p.buf = nil
	}
}
