package leasehold

import "sync/atomic"

// LiveLeases counts the lease handles not yet freed (the tests' leak check).
func LiveLeases() int64 { return atomic.LoadInt64(&liveLeases) }
