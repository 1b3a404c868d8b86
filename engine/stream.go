package engine

import (
	"context"
	"fmt"
	"io"
	"sync"
)

// Stream delivers one request's events in order: one per generated token, the last of
// which has Finish set (or a single event with FinishCancelled or FinishError when the
// request ends without a token). The engine never waits for the reader: events queue in
// the stream until Recv takes them. A Stream is safe for concurrent use, though one reader
// is the usual.
type Stream struct {
	id string

	mu     sync.Mutex
	events []Event
	ended  bool          // the final event was queued
	notify chan struct{} // signalled (capacity 1) when an event is queued
}

func newStream(id string) *Stream { return &Stream{id: id, notify: make(chan struct{}, 1)} }

// ID is the request's ID (Request.ID, or the one the engine assigned).
func (s *Stream) ID() string { return s.id }

// Recv returns the next event, waiting for it until ctx ends. After the final event (the one
// with Finish set) it returns io.EOF. Ending ctx only stops this wait; to cancel the request,
// end the context given to Submit.
func (s *Stream) Recv(ctx context.Context) (Event, error) {
	for {
		s.mu.Lock()
		if len(s.events) > 0 {
			ev := s.events[0]
			s.events[0] = Event{}
			s.events = s.events[1:]
			s.mu.Unlock()
			return ev, nil
		}
		ended := s.ended
		s.mu.Unlock()
		if ended {
			return Event{}, io.EOF
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return Event{}, fmt.Errorf("request %s: %w", s.id, ctx.Err())
		}
	}
}

// Collect reads every remaining event until the end and returns the generated tokens and
// the final event.
func (s *Stream) Collect(ctx context.Context) (tokens []int, last Event, err error) {
	for {
		ev, err := s.Recv(ctx)
		if err == io.EOF {
			return tokens, last, nil
		}
		if err != nil {
			return tokens, last, err
		}
		if ev.Finish == FinishNone || ev.Finish == FinishStop || ev.Finish == FinishLength {
			tokens = append(tokens, ev.Token)
		}
		last = ev
	}
}

// push queues an event; the one with Finish set ends the stream.
func (s *Stream) push(ev Event) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.events = append(s.events, ev)
	s.ended = ev.Finish != FinishNone
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}
