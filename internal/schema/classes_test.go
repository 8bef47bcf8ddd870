package schema

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

func TestParseClass(t *testing.T) {
	cases := []struct {
		in   string
		want Class
		err  error // nil: valid
	}{
		{"critical=60%", Class{"critical", Reserve{Share: 6000}}, nil},
		{"critical=12.5%", Class{"critical", Reserve{Share: 1250}}, nil},
		{"critical=0.01%", Class{"critical", Reserve{Share: 1}}, nil},
		{"critical=100%", Class{"critical", Reserve{Share: 10000}}, nil},
		{"critical=0%", Class{"critical", Reserve{}}, nil},
		{"critical=600", Class{"critical", Reserve{Count: 600}}, nil},
		{"batch", Class{"batch", Reserve{}}, nil},
		{"tier-0_a", Class{"tier-0_a", Reserve{}}, nil},
		{"critical=100.01%", Class{}, ErrInvalidReserve},
		{"critical=101%", Class{}, ErrInvalidReserve},
		{"critical=1.234%", Class{}, ErrInvalidReserve},
		{"critical=1.%", Class{}, ErrInvalidReserve},
		{"critical=.5%", Class{}, ErrInvalidReserve},
		{"critical=-1", Class{}, ErrInvalidReserve},
		{"critical=1.5", Class{}, ErrInvalidReserve},
		{"critical=", Class{}, ErrInvalidReserve},
		{"critical=%", Class{}, ErrInvalidReserve},
		{"critical=1000000000001", Class{}, ErrInvalidReserve},
		{"critical=1e3", Class{}, ErrInvalidReserve},
		{"", Class{}, ErrInvalidClassName},
		{"=5", Class{}, ErrInvalidClassName},
		{"Critical", Class{}, ErrInvalidClassName},
		{"9lives", Class{}, ErrInvalidClassName},
		{"a b", Class{}, ErrInvalidClassName},
		{strings.Repeat("a", 33), Class{}, ErrInvalidClassName},
		{"crïtical", Class{}, ErrInvalidClassName},
	}
	for _, tc := range cases {
		got, err := ParseClass(tc.in)
		if tc.err == nil {
			if err != nil || got != tc.want {
				t.Errorf("ParseClass(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
			if again, err := ParseClass(got.String()); err != nil || again != got {
				t.Errorf("ParseClass(%q) = %+v, %v: String does not parse back to %+v", got.String(), again, err, got)
			}
			continue
		}
		if !errors.Is(err, tc.err) || !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseClass(%q) = %+v, %v; want %v", tc.in, got, err, tc.err)
		}
	}
}

func TestProviderConfigClassesValidate(t *testing.T) {
	cls := func(s ...string) []Class {
		var out []Class
		for _, x := range s {
			c, err := ParseClass(x)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, c)
		}
		return out
	}
	many := make([]string, MaxClasses+1)
	for i := range many {
		many[i] = fmt.Sprintf("c%d", i)
	}
	cases := []struct {
		name    string
		classes []Class
		modify  func(*ProviderConfig)
		want    error // nil: valid
	}{
		{"none", nil, nil, nil},
		{"the issue's example", cls("critical=60%", "default", "batch"), nil, nil},
		{"counts up to the limit", cls("a=600", "b=400"), nil, nil},
		{"shares up to 100%", cls("a=60%", "b=40%"), nil, nil},
		{"mixed up to the limit", cls("a=60%", "b=400"), nil, nil},
		{"most classes", cls(many[:MaxClasses]...), nil, nil},
		{"too many", cls(many...), nil, ErrInvalidClasses},
		{"duplicate", cls("a", "b", "a"), nil, ErrInvalidClasses},
		{"counts over the limit", cls("a=600", "b=401"), nil, ErrReservesOverLimit},
		{"shares over 100%", cls("a=60%", "b=40.01%"), nil, ErrReservesOverLimit},
		{"shares over 100% of a small limit", cls("a=60%", "b=60%"), func(c *ProviderConfig) { c.Limit = 1 }, ErrReservesOverLimit},
		{"mixed over the limit", cls("a=60%", "b=401"), nil, ErrReservesOverLimit},
		{"empty name", []Class{{Name: ""}}, nil, ErrInvalidClassName},
		{"bad name", []Class{{Name: "A"}}, nil, ErrInvalidClassName},
		{"negative count", []Class{{Name: "a", Reserve: Reserve{Count: -1}}}, nil, ErrInvalidReserve},
		{"share over 100%", []Class{{Name: "a", Reserve: Reserve{Share: 10001}}}, nil, ErrInvalidReserve},
		{"count and share", []Class{{Name: "a", Reserve: Reserve{Count: 1, Share: 1}}}, nil, ErrInvalidReserve},
		{"adaptive: of the ceiling", cls("a=800"), func(c *ProviderConfig) {
			c.Adaptive = &Adaptive{Ceiling: 1000, Floor: 100}
			c.Limit = 200
		}, nil},
		{"adaptive: over the ceiling", cls("a=1001"), func(c *ProviderConfig) {
			c.Adaptive = &Adaptive{Ceiling: 1000, Floor: 100}
		}, ErrReservesOverLimit},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig() // limit 1000
			c.Classes = tc.classes
			if tc.modify != nil {
				tc.modify(&c)
			}
			err := c.Validate()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.Is(err, tc.want) || !errors.As(err, &ve) || !strings.HasPrefix(ve.Field, "classes") {
				t.Fatalf("Validate() = %v (%#v), want %v naming the classes", err, err, tc.want)
			}
		})
	}
}

func TestClassesJSON(t *testing.T) {
	c := validConfig()
	c.Classes = []Class{{"critical", Reserve{Share: 1250}}, {"default", Reserve{Count: 100}}, {"batch", Reserve{}}}
	b, err := Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	want := `"classes":[{"name":"critical","reserve":"12.5%"},{"name":"default","reserve":100},{"name":"batch"}]`
	if !strings.Contains(string(b), want) {
		t.Errorf("encoding = %s, want it to hold %s", b, want)
	}
	c2, err := DecodeProviderConfig(b)
	if err != nil || !c2.Equal(c) {
		t.Errorf("round trip: %+v, %v; want %+v", c2, err, c)
	}
	for _, body := range []string{
		`{"limit":1000,"classes":[{"name":"a","reserve":"60"}]}`,
		`{"limit":1000,"classes":[{"name":"a","reserve":1.5}]}`,
		`{"limit":1000,"classes":[{"name":"a","reserve":-1}]}`,
		`{"limit":1000,"classes":[{"name":"a","reserve":"101%"}]}`,
		`{"limit":1000,"classes":[{"name":"a","reserve":true}]}`,
	} {
		_, err := DecodeProviderConfigInput([]byte(body), "payments")
		if !errors.Is(err, ErrInvalidReserve) {
			t.Errorf("DecodeProviderConfigInput(%s) = %v, want %v", body, err, ErrInvalidReserve)
		}
	}
	for _, body := range []string{
		`{"limit":1000,"classes":[{"name":"a","reserve":1,"RESERVE":2}]}`,
		`{"limit":1000,"classes":[{"name":"a","weight":1}]}`,
	} {
		if _, err := DecodeProviderConfigInput([]byte(body), "payments"); !errors.Is(err, ErrInvalid) {
			t.Errorf("DecodeProviderConfigInput(%s) = %v, want an error", body, err)
		}
	}
}

// TestReservesNeverExceedTheLimit checks Reserves over random classes and
// limits: the reserves add up to at most the limit asked for, and are
// those of the config when it is the limit they are of.
func TestReservesNeverExceedTheLimit(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for range 10000 {
		c := validConfig()
		c.Limit = 1 + rng.Int64N(min(MaxLimit, int64(1)<<rng.IntN(41)))
		for i := range 1 + rng.IntN(MaxClasses) {
			cl := Class{Name: fmt.Sprintf("c%d", i)}
			switch rng.IntN(3) {
			case 0:
				cl.Reserve.Count = rng.Int64N(c.Limit/int64(MaxClasses) + 1)
			case 1:
				cl.Reserve.Share = rng.Int64N(10000/int64(MaxClasses) + 1)
			}
			c.Classes = append(c.Classes, cl)
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("seed %d: %+v: %v", seed, c.Classes, err)
		}
		full := c.Reserves(c.Limit)
		for i, cl := range c.Classes {
			if full[i] != cl.Reserve.Of(c.Limit) {
				t.Fatalf("seed %d: Reserves(%d)[%d] = %d, want %d", seed, c.Limit, i, full[i], cl.Reserve.Of(c.Limit))
			}
		}
		limit := rng.Int64N(c.Limit + 1)
		var sum int64
		for _, r := range c.Reserves(limit) {
			if r < 0 {
				t.Fatalf("seed %d: negative reserve", seed)
			}
			sum += r
		}
		if sum > limit {
			t.Fatalf("seed %d: %+v: reserves of %d add up to %d", seed, c.Classes, limit, sum)
		}
	}
}

func TestInstanceRecordClassDemand(t *testing.T) {
	rec := InstanceRecord{Version: Version, ID: "i-1", ClassDemand: map[string]int64{"critical": 40, "batch": 900},
		ClassAdmitted: map[string]int64{"critical": 1200, "batch": 0}}
	b, err := Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"class_demand":{"batch":900,"critical":40}`) {
		t.Errorf("encoded %s, want class_demand by name", b)
	}
	if !strings.Contains(string(b), `"class_admitted":{"batch":0,"critical":1200}`) {
		t.Errorf("encoded %s, want class_admitted by name", b)
	}
	got, err := DecodeInstanceRecord(b)
	if err != nil || !reflect.DeepEqual(got.ClassDemand, rec.ClassDemand) || !reflect.DeepEqual(got.ClassAdmitted, rec.ClassAdmitted) {
		t.Errorf("round trip: %v, %v, %v", got.ClassDemand, got.ClassAdmitted, err)
	}
	if b, err := Encode(InstanceRecord{Version: Version, ID: "i-1"}); err != nil || strings.Contains(string(b), "class_demand") || strings.Contains(string(b), "class_admitted") {
		t.Errorf("a record without classes: %s, %v; want no class_demand nor class_admitted", b, err)
	}
	many := map[string]int64{}
	for i := range MaxClasses + 1 {
		many[fmt.Sprintf("c%d", i)] = 1
	}
	for _, cd := range []map[string]int64{{"Critical": 1}, {"": 1}, {"<b>": 1}, {"a": -1}, {"a": MaxLimit + 1}, many} {
		bad := rec
		bad.ClassDemand = cd
		if _, err := Encode(bad); !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrInvalidClassName) {
			t.Errorf("class_demand %v: %v, want refused", cd, err)
		}
		bad = rec
		bad.ClassAdmitted = cd
		if _, err := Encode(bad); !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrInvalidClassName) {
			t.Errorf("class_admitted %v: %v, want refused", cd, err)
		}
	}
	for _, field := range []string{"class_demand", "class_admitted"} {
		for _, s := range []string{
			`{"version":1,"id":"i-1","started":"0001-01-01T00:00:00Z","updated":"0001-01-01T00:00:00Z","demand":0,"admitted":0,"clock_offset":"0s","clock_known":false,"applied_generation":0,"` + field + `":{"a":1,"a":2}}`,
			`{"version":1,"id":"i-1","started":"0001-01-01T00:00:00Z","updated":"0001-01-01T00:00:00Z","demand":0,"admitted":0,"clock_offset":"0s","clock_known":false,"applied_generation":0,"` + field + `":{"a":"1"}}`,
		} {
			if r, err := DecodeInstanceRecord([]byte(s)); err == nil {
				t.Errorf("decoded %s as %+v, %+v, want refused", s, r.ClassDemand, r.ClassAdmitted)
			}
		}
	}
}
