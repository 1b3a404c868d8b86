package cuda

import (
	"sync"
	"time"

	"github.com/loom-ml/loom/cubind"
)

// deviceClock adds up the device time of a program's runs: the time between two events
// recorded on the stream around a run's copies and kernels. Comparing it with the wall
// time of the same runs shows what the host adds between them. Its methods other than
// total and reset run with the device locked; a failure to make or read the events only
// leaves the clock short.
type deviceClock struct {
	mu         sync.Mutex
	begin, end cubind.Event
	recorded   bool
	sum        time.Duration
	runs       int
}

// start records the beginning of a run on s.
func (c *deviceClock) start(s cubind.Stream) {
	c.recorded = false
	if c.begin == 0 {
		var err error
		if c.begin, err = cubind.EventCreate(cubind.EventDefault); err != nil {
			return
		}
		if c.end, err = cubind.EventCreate(cubind.EventDefault); err != nil {
			c.begin.Destroy()
			c.begin = 0
			return
		}
	}
	c.recorded = c.begin.Record(s) == nil
}

// stop records the end of the run's kernels on s.
func (c *deviceClock) stop(s cubind.Stream) {
	c.recorded = c.recorded && c.end.Record(s) == nil
}

// add counts the run once the stream has passed stop's event (after the run's outputs
// were downloaded or the stream synchronized).
func (c *deviceClock) add() {
	if !c.recorded {
		return
	}
	c.recorded = false
	c.addSpan(c.begin, c.end)
}

// addSpan counts a run timed by its own events, once the stream has passed end.
func (c *deviceClock) addSpan(begin, end cubind.Event) {
	d, err := cubind.Elapsed(begin, end)
	if err != nil {
		return
	}
	c.mu.Lock()
	c.sum += d
	c.runs++
	c.mu.Unlock()
}

// total is the device time and the number of runs counted since the last reset.
func (c *deviceClock) total() (time.Duration, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sum, c.runs
}

func (c *deviceClock) reset() {
	c.mu.Lock()
	c.sum, c.runs = 0, 0
	c.mu.Unlock()
}

// destroy frees the events (with the device locked).
func (c *deviceClock) destroy() {
	if c.begin != 0 {
		c.begin.Destroy()
		c.end.Destroy()
		c.begin, c.end = 0, 0
	}
}

// DeviceTime returns the device time of the runs since the last ResetDeviceTime (or since
// Compile) and their number: per run, from the copy of its inputs to the end of its last
// kernel, sampling and output copies left out. Runs that failed are not counted.
func (p *Program) DeviceTime() (time.Duration, int) { return p.busy.total() }

// ResetDeviceTime starts DeviceTime over.
func (p *Program) ResetDeviceTime() { p.busy.reset() }
