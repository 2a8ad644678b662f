package controlplane

import (
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// WriteKubeconfig writes config as a kubeconfig file that kubectl, the
// sidecars and the scheduler can use.
func WriteKubeconfig(config *rest.Config, path string) error {
	const name = "diskfit-local"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{
		Server:                   config.Host,
		CertificateAuthorityData: config.CAData,
		TLSServerName:            config.ServerName,
		InsecureSkipTLSVerify:    config.Insecure,
	}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{
		Token:                 config.BearerToken,
		ClientCertificateData: config.CertData,
		ClientKeyData:         config.KeyData,
	}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	return clientcmd.WriteToFile(*kc, path)
}
