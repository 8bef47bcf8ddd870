package alloc

import (
	"errors"
	"fmt"
	"math"
	mrand "math/rand"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/quick"
)

// ins builds instances from alternating id, demand pairs.
func ins(pairs ...any) []Instance {
	var out []Instance
	for i := 0; i < len(pairs); i += 2 {
		var d float64
		switch v := pairs[i+1].(type) {
		case int:
			d = float64(v)
		case float64:
			d = v
		}
		out = append(out, Instance{ID: pairs[i].(string), Demand: d})
	}
	return out
}

func TestEven(t *testing.T) {
	tests := []struct {
		name  string
		total int64
		in    []Instance
		want  []int64
	}{
		{"no instances", 10, nil, []int64{}},
		{"divides", 9, ins("a", 0, "b", 0, "c", 0), []int64{3, 3, 3}},
		{"remainder to smallest id", 10, ins("b", 0, "a", 0, "c", 0), []int64{3, 4, 3}},
		{"remainder 2", 11, ins("c", 0, "b", 0, "a", 0), []int64{3, 4, 4}},
		{"fewer permits than instances", 2, ins("a", 0, "b", 0, "c", 0), []int64{1, 1, 0}},
		{"zero total", 0, ins("a", 5, "b", 0), []int64{0, 0}},
		{"demand ignored", 10, ins("a", 1000, "b", 0), []int64{5, 5}},
		{"huge total", math.MaxInt64, ins("a", 0, "b", 0), []int64{math.MaxInt64/2 + 1, math.MaxInt64 / 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Even(tt.total, 1, tt.in)
			if err != nil {
				t.Fatalf("Even: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Even(%d, %v) = %v, want %v", tt.total, tt.in, got, tt.want)
			}
		})
	}
}

func TestFair(t *testing.T) {
	tests := []struct {
		name  string
		total int64
		floor int64
		in    []Instance
		want  []int64
	}{
		{"no instances", 10, 1, nil, []int64{}},
		// Water-filling: a is satisfied, b and c share the rest equally.
		{"water-filling", 100, 0, ins("a", 10, "b", 50, "c", 80), []int64{10, 45, 45}},
		// d's floor is 1; level 44 for b and c, the one permit left goes to b (id order).
		{"remainder by id", 100, 1, ins("a", 10, "b", 50, "c", 80, "d", 0), []int64{10, 45, 44, 1}},
		{"input order irrelevant", 100, 1, ins("d", 0, "c", 80, "b", 50, "a", 10), []int64{1, 44, 45, 10}},
		// Floors come first: idle b and c keep 5 each, busy a takes the rest.
		{"floor for idle", 100, 5, ins("a", 1000, "b", 0, "c", 0), []int64{90, 5, 5}},
		// Everyone wants more than an equal share: even split.
		{"all saturated", 10, 0, ins("a", 100, "b", 100, "c", 100), []int64{4, 3, 3}},
		// Spare capacity: wants 30,10,1 (floor) of 100; D'Hondt gives
		// ⌊w·100/41⌋ = 73,24,2 and the last permit to the largest w/(s+1): a (30/74).
		{"spare in proportion", 100, 1, ins("a", 30, "b", 10, "c", 0), []int64{74, 24, 2}},
		{"exactly satisfied", 41, 1, ins("a", 30, "b", 10, "c", 0), []int64{30, 10, 1}},
		// Fractional demand is rounded up.
		{"fraction rounds up", 10, 0, ins("a", 0.2, "b", 100), []int64{1, 9}},
		// A demand above the total counts as the total.
		{"demand above total", 10, 0, ins("a", 1e30, "b", 0), []int64{10, 0}},
		// No floor and no demand: split as by Even.
		{"nothing wanted", 10, 0, ins("b", 0, "a", 0, "c", 0), []int64{3, 4, 3}},
		// Total too small for every floor: floors are wants like any other.
		{"floors unaffordable", 5, 2, ins("a", 0, "b", 0, "c", 0), []int64{2, 2, 1}},
		{"zero total", 0, 1, ins("a", 10, "b", 0), []int64{0, 0}},
		{"one instance, spare", 1000, 1, ins("a", 10), []int64{1000}},
		{"huge total", math.MaxInt64, 1, ins("a", 1e300, "b", 1), []int64{math.MaxInt64 - 1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Fair(tt.total, tt.floor, tt.in)
			if err != nil {
				t.Fatalf("Fair: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Fair(%d, floor %d, %v) = %v, want %v", tt.total, tt.floor, tt.in, got, tt.want)
			}
		})
	}
}

func TestInvalidInput(t *testing.T) {
	tests := []struct {
		name    string
		total   int64
		floor   int64
		in      []Instance
		message string
	}{
		{"negative total", -1, 0, ins("a", 1), "total -1 is negative"},
		{"negative floor", 10, -1, ins("a", 1), "floor -1 is negative"},
		{"empty id", 10, 0, ins("", 1), "empty id"},
		{"duplicate id", 10, 0, ins("a", 1, "b", 2, "a", 3), `"a" appears more than once`},
		{"negative demand", 10, 0, ins("a", -1), `"a" has demand -1`},
		{"NaN demand", 10, 0, ins("a", math.NaN()), `"a" has demand NaN`},
		{"infinite demand", 10, 0, ins("a", math.Inf(1)), `"a" has demand +Inf`},
	}
	for _, tt := range tests {
		for _, name := range Names() {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				algo, _ := ByName(name)
				got, err := algo(tt.total, tt.floor, tt.in)
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("err = %v, want ErrInvalid", err)
				}
				if !strings.Contains(err.Error(), tt.message) {
					t.Errorf("err = %q, want it to mention %q", err, tt.message)
				}
				if got != nil {
					t.Errorf("shares = %v, want nil on error", got)
				}
			})
		}
	}
}

func TestByName(t *testing.T) {
	for _, name := range Names() {
		if _, err := ByName(name); err != nil {
			t.Errorf("ByName(%q): %v", name, err)
		}
	}
	for _, name := range []string{"", "Fair", "doorman", "even "} {
		_, err := ByName(name)
		if !errors.Is(err, ErrUnknownAlgorithm) {
			t.Fatalf("ByName(%q) err = %v, want ErrUnknownAlgorithm", name, err)
		}
		if !strings.Contains(err.Error(), "allowed are even, fair") {
			t.Errorf("ByName(%q) err = %q, want it to list the allowed names", name, err)
		}
	}
}

func TestDefaultFloor(t *testing.T) {
	tests := []struct {
		total int64
		n     int
		want  int64
	}{
		{1000, 10, 1}, {100000, 10, 100}, {10, 100, 1}, {0, 10, 0}, {10, 0, 0},
	}
	for _, tt := range tests {
		if got := DefaultFloor(tt.total, tt.n); got != tt.want {
			t.Errorf("DefaultFloor(%d, %d) = %d, want %d", tt.total, tt.n, got, tt.want)
		}
	}
}

func TestInputNotModified(t *testing.T) {
	in := ins("c", 5, "a", 50, "b", 0)
	orig := slices.Clone(in)
	for _, name := range Names() {
		algo, _ := ByName(name)
		if _, err := algo(30, 1, in); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(in, orig) {
			t.Fatalf("%s modified its input: %v, was %v", name, in, orig)
		}
	}
}

// scenario is a random allocation problem for testing/quick.
type scenario struct {
	Total, Floor int64
	In           []Instance
}

// Generate makes scenarios that hit every regime: totals below and above
// total demand, floors that do and do not fit, ties, zero and huge demands.
func (scenario) Generate(qr *mrand.Rand, size int) reflect.Value {
	r := rand.New(rand.NewPCG(qr.Uint64(), qr.Uint64()))
	n := 1 + r.IntN(min(size, 40)+1)
	var s scenario
	switch r.IntN(4) {
	case 0:
		s.Total = r.Int64N(int64(n) * 3) // fewer permits than floors or instances
	case 1:
		s.Total = r.Int64N(10000)
	case 2:
		s.Total = r.Int64N(1 << 40)
	default:
		s.Total = math.MaxInt64 - r.Int64N(1000)
	}
	switch r.IntN(3) {
	case 0:
		s.Floor = 0
	case 1:
		s.Floor = DefaultFloor(s.Total, n)
	default:
		s.Floor = r.Int64N(20)
	}
	ids := r.Perm(n * 3)
	scale := float64(max(s.Total, 1)) / float64(n)
	for i := range n {
		var d float64
		switch r.IntN(6) {
		case 0:
			d = 0
		case 1:
			d = float64(r.IntN(5)) // small, ties likely
		case 2:
			d = r.Float64() * scale * 3
		case 3:
			d = math.Round(r.Float64() * scale)
		case 4:
			d = r.Float64() * 1e300
		default:
			d = r.Float64() * 2
		}
		s.In = append(s.In, Instance{ID: fmt.Sprintf("i%03d", ids[i]), Demand: d})
	}
	return reflect.ValueOf(s)
}

// wantsOf recomputes the wants independently of the code under test.
func wantsOf(s scenario) []int64 {
	w := make([]int64, len(s.In))
	for i, in := range s.In {
		c := math.Ceil(in.Demand)
		if c >= float64(s.Total) {
			w[i] = s.Total
		} else {
			w[i] = int64(c)
		}
		w[i] = min(max(w[i], s.Floor), s.Total)
	}
	return w
}

// checkCommon checks what every algorithm promises; it returns a
// description of the first violation, or "".
func checkCommon(s scenario, x []int64) string {
	if len(x) != len(s.In) {
		return fmt.Sprintf("%d shares for %d instances", len(x), len(s.In))
	}
	var sum int64
	for i, v := range x {
		if v < 0 {
			return fmt.Sprintf("share %d of %s is negative", v, s.In[i].ID)
		}
		if sum > math.MaxInt64-v {
			return "shares overflow int64"
		}
		sum += v
	}
	if sum != s.Total {
		return fmt.Sprintf("shares add up to %d, total is %d", sum, s.Total)
	}
	n := int64(len(s.In))
	if s.Floor <= s.Total/n { // T ≥ N·floor, without overflow
		for i, v := range x {
			if v < s.Floor {
				return fmt.Sprintf("%s gets %d, below the floor %d though total %d allows floors",
					s.In[i].ID, v, s.Floor, s.Total)
			}
		}
	}
	return ""
}

// checkMaxMin checks max-min fairness directly from its definition.
func checkMaxMin(s scenario, x []int64) string {
	w := wantsOf(s)
	var sumW int64
	short := false // Σw > total, computed without overflow
	for _, v := range w {
		if v > s.Total-sumW {
			short = true
			break
		}
		sumW += v
	}
	if !short {
		// Enough for everyone: nobody may get less than it wants.
		for i := range x {
			if x[i] < w[i] {
				return fmt.Sprintf("%s gets %d < wants %d though total %d covers all wants %d",
					s.In[i].ID, x[i], w[i], s.Total, sumW)
			}
		}
		return ""
	}
	for i := range x {
		// Nobody gets more than it wants (its demand, or the floor).
		if x[i] > w[i] {
			return fmt.Sprintf("%s gets %d > wants %d while capacity is short", s.In[i].ID, x[i], w[i])
		}
		// Whoever gets less than it wants is at most one permit (integer
		// granularity) below anyone else.
		if x[i] < w[i] {
			for j := range x {
				if x[j] > x[i]+1 {
					return fmt.Sprintf("%s gets %d < wants %d while %s gets %d, more than an equal share",
						s.In[i].ID, x[i], w[i], s.In[j].ID, x[j])
				}
			}
		}
	}
	return ""
}

func byIDMap(in []Instance, x []int64) map[string]int64 {
	m := make(map[string]int64, len(in))
	for i, v := range x {
		m[in[i].ID] = v
	}
	return m
}

func TestProperties(t *testing.T) {
	cfg := &quick.Config{MaxCount: 3000}
	for _, name := range Names() {
		algo, _ := ByName(name)
		t.Run(name+"/sum, floor and fairness", func(t *testing.T) {
			f := func(s scenario) bool {
				x, err := algo(s.Total, s.Floor, s.In)
				if err != nil {
					t.Logf("%+v: %v", s, err)
					return false
				}
				msg := checkCommon(s, x)
				if msg == "" && name == NameFair {
					msg = checkMaxMin(s, x)
				}
				if msg != "" {
					t.Logf("%+v → %v: %s", s, x, msg)
				}
				return msg == ""
			}
			if err := quick.Check(f, cfg); err != nil {
				t.Error(err)
			}
		})
		t.Run(name+"/monotonic in total", func(t *testing.T) {
			f := func(s scenario, step uint16) bool {
				if s.Total > math.MaxInt64-int64(step)-1 {
					s.Total -= int64(step) + 1
				}
				for _, more := range []int64{1, int64(step) + 1} {
					lo, err1 := algo(s.Total, s.Floor, s.In)
					hi, err2 := algo(s.Total+more, s.Floor, s.In)
					if err1 != nil || err2 != nil {
						t.Logf("errors: %v, %v", err1, err2)
						return false
					}
					for i := range lo {
						if hi[i] < lo[i] {
							t.Logf("%+v: raising total by %d lowers %s from %d to %d",
								s, more, s.In[i].ID, lo[i], hi[i])
							return false
						}
					}
				}
				return true
			}
			if err := quick.Check(f, cfg); err != nil {
				t.Error(err)
			}
		})
		t.Run(name+"/deterministic under permutation", func(t *testing.T) {
			f := func(s scenario, seed uint64) bool {
				x, err := algo(s.Total, s.Floor, s.In)
				if err != nil {
					return false
				}
				shuffled := slices.Clone(s.In)
				r := rand.New(rand.NewPCG(seed, 1))
				r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				y, err := algo(s.Total, s.Floor, shuffled)
				if err != nil {
					return false
				}
				if a, b := byIDMap(s.In, x), byIDMap(shuffled, y); !reflect.DeepEqual(a, b) {
					t.Logf("%+v: %v, shuffled %v", s, a, b)
					return false
				}
				return true
			}
			if err := quick.Check(f, cfg); err != nil {
				t.Error(err)
			}
		})
	}
}

// referenceFair hands permits out one at a time, which is max-min fairness
// by its definition: while someone is short of its wants, the next permit
// goes to the one with the smallest share (ties by id); once all wants are
// met, the next permit goes by D'Hondt, to the largest wants/(share+1) (ties
// by id). O(total·N): small cases only.
func referenceFair(s scenario) []int64 {
	w := wantsOf(s)
	x := make([]int64, len(w))
	var sumW int64
	for _, v := range w {
		sumW += v
	}
	less := func(i, j int) bool { return s.In[i].ID < s.In[j].ID }
	for range s.Total {
		best := -1
		for i := range x {
			if x[i] >= w[i] {
				continue
			}
			if best < 0 || x[i] < x[best] || x[i] == x[best] && less(i, best) {
				best = i
			}
		}
		if best < 0 { // all wants met: D'Hondt on wants
			for i := range x {
				if best < 0 {
					best = i
					continue
				}
				a, b := w[i]*(x[best]+1), w[best]*(x[i]+1)
				if a > b || a == b && less(i, best) {
					best = i
				}
			}
		}
		if sumW == 0 { // nothing wanted: Even
			return nil
		}
		x[best]++
	}
	return x
}

func TestFairMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 3000 {
		n := 1 + r.IntN(8)
		s := scenario{Total: r.Int64N(300), Floor: r.Int64N(4)}
		for i := range n {
			s.In = append(s.In, Instance{ID: fmt.Sprintf("i%d", r.IntN(1000)*10+i), Demand: float64(r.IntN(80)) * r.Float64()})
		}
		want := referenceFair(s)
		if want == nil {
			continue
		}
		got, err := Fair(s.Total, s.Floor, s.In)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("case %d %+v: Fair = %v, one-permit-at-a-time reference = %v", iter, s, got, want)
		}
	}
}

// FuzzAlgorithms decodes instances from bytes (3 bytes each: id, demand
// high, demand low) and checks every promise on them.
func FuzzAlgorithms(f *testing.F) {
	f.Add(int64(100), int64(1), []byte{1, 0, 10, 2, 0, 50, 3, 0, 80})
	f.Add(int64(5), int64(2), []byte{1, 0, 0, 2, 0, 0, 3, 0, 0})
	f.Add(int64(math.MaxInt64), int64(0), []byte{1, 255, 255})
	f.Fuzz(func(t *testing.T, total, floor int64, data []byte) {
		var s scenario
		s.Total, s.Floor = total, floor
		seen := map[byte]bool{}
		for i := 0; i+2 < len(data); i += 3 {
			if seen[data[i]] {
				continue
			}
			seen[data[i]] = true
			d := float64(int(data[i+1])<<8|int(data[i+2])) / 7
			s.In = append(s.In, Instance{ID: fmt.Sprintf("i%d", data[i]), Demand: d})
		}
		for _, name := range Names() {
			algo, _ := ByName(name)
			x, err := algo(s.Total, s.Floor, s.In)
			if total < 0 || floor < 0 {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("%s: err = %v, want ErrInvalid", name, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if len(s.In) == 0 {
				continue
			}
			msg := checkCommon(s, x)
			if msg == "" && name == NameFair {
				msg = checkMaxMin(s, x)
			}
			if msg != "" {
				t.Fatalf("%s %+v → %v: %s", name, s, x, msg)
			}
		}
	})
}

func BenchmarkAlgorithms(b *testing.B) {
	for _, name := range Names() {
		algo, _ := ByName(name)
		for _, n := range []int{10, 1000, 100000} {
			r := rand.New(rand.NewPCG(uint64(n), 7))
			in := make([]Instance, n)
			for i := range in {
				in[i] = Instance{ID: fmt.Sprintf("instance-%06d", r.IntN(1_000_000_000)*1000+i), Demand: r.ExpFloat64() * 100}
			}
			// short: total demand ≈ 100·N > total (water-filling);
			// spare: total ≫ demand (D'Hondt apportionment).
			for _, regime := range []struct {
				name  string
				total int64
			}{{"short", int64(n) * 50}, {"spare", int64(n) * 1000}} {
				b.Run(fmt.Sprintf("%s/n=%d/%s", name, n, regime.name), func(b *testing.B) {
					floor := DefaultFloor(regime.total, n)
					b.ReportAllocs()
					for b.Loop() {
						if _, err := algo(regime.total, floor, in); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
