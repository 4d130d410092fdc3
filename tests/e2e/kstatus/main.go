// Command kstatus prints the status that kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status, the library Flux's
// health checks and kpt use) computes for Kubernetes resources given as JSON: Current, InProgress, Failed,
// Terminating, with kstatus' message.
//
//	kubectl get topo pageload -o json | kstatus
//	kstatus a.json b.json          # one line per resource: NAME<TAB>STATUS<TAB>MESSAGE
//	kstatus -json a.json           # one JSON object per resource instead
//
// A kubectl List (`kubectl get topo -o json`) gives one line per item. With -expect STATUS the exit code is 3
// when any resource's status is not STATUS; 1 is an unreadable input.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type result struct {
	Source  string `json:"source"`
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	asJSON := flag.Bool("json", false, "print one JSON object per resource")
	expect := flag.String("expect", "", "exit 3 unless every resource's status is this one")
	flag.Parse()
	sources := flag.Args()
	if len(sources) == 0 {
		sources = []string{"-"}
	}
	mismatch := false
	for _, source := range sources {
		results, err := compute(source)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kstatus: %s: %v\n", source, err)
			os.Exit(1)
		}
		for _, r := range results {
			if *asJSON {
				line, _ := json.Marshal(r)
				fmt.Println(string(line))
			} else {
				fmt.Printf("%s\t%s\t%s\n", r.Name, r.Status, strings.ReplaceAll(r.Message, "\n", " "))
			}
			if *expect != "" && r.Status != *expect {
				mismatch = true
			}
		}
	}
	if mismatch {
		os.Exit(3)
	}
}

func compute(source string) ([]result, error) {
	var data []byte
	var err error
	if source == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(source)
	}
	if err != nil {
		return nil, err
	}
	// apimachinery's JSON: whole numbers as int64, which kstatus' NestedInt64 (generations) requires
	var object map[string]interface{}
	if err := utiljson.Unmarshal(data, &object); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	resource := &unstructured.Unstructured{Object: object}
	objects := []*unstructured.Unstructured{resource}
	if resource.IsList() {
		list, err := resource.ToList()
		if err != nil {
			return nil, err
		}
		objects = objects[:0]
		for i := range list.Items {
			objects = append(objects, &list.Items[i])
		}
	}
	results := make([]result, 0, len(objects))
	for _, u := range objects {
		computed, err := status.Compute(u)
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", u.GetKind(), u.GetName(), err)
		}
		results = append(results, result{
			Source: source, Kind: u.GetKind(), Name: u.GetName(),
			Status: computed.Status.String(), Message: computed.Message,
		})
	}
	return results, nil
}
