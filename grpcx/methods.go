package grpcx

import (
	"fmt"
	"strings"

	"google.golang.org/grpc"
)

// ServiceInfoProvider is what CheckMethods reads the served methods from:
// *grpc.Server is one.
type ServiceInfoProvider interface {
	GetServiceInfo() map[string]grpc.ServiceInfo
}

// CheckMethods reports, in one error, every name in methods (an
// Options.Methods) that srv does not serve as a unary method: a misspelled
// or unregistered name, or a streaming method, for which gRPC calls no
// unary interceptor. Calls to such a method run unguarded, however often
// they are sent. Call it at start-up, after the services are registered;
// nil means every listed method is guarded.
func CheckMethods(srv ServiceInfoProvider, methods []string) error {
	unary := map[string]bool{} // full method name → unary
	for svc, info := range srv.GetServiceInfo() {
		for _, m := range info.Methods {
			unary["/"+svc+"/"+m.Name] = !m.IsClientStream && !m.IsServerStream
		}
	}
	var bad []string
	for _, m := range methods {
		switch isUnary, served := unary[m]; {
		case !served:
			bad = append(bad, fmt.Sprintf("%q is not served (a full name is \"/package.Service/Method\")", m))
		case !isUnary:
			bad = append(bad, fmt.Sprintf("%q is a streaming method, which the unary interceptor never sees", m))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("grpcx: %d of Options.Methods would run unguarded: %s", len(bad), strings.Join(bad, "; "))
}
