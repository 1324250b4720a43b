package regional_test

import (
	"testing"

	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/storetest"
)

func TestMemoryStoreReservations(t *testing.T) {
	storetest.RunReservations(t, &regional.MemoryStore{})
}
