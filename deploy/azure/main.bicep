// Reference deployment (docs/deploy.md): one storage account with shared keys disabled and
// no public network access (private endpoints for its tables and queues in a virtual
// network), a user-assigned managed identity with the table and queue data roles on it, and
// the image as two Container Apps (API, fan-out worker) in that network, plus a manual job
// for `timeline init`.
// The worker scales on the depth of its queue (KEDA's azure-queue scaler, signed in with
// the same identity). Deploy into a resource group:
//   az deployment group create -g RG -f deploy/azure/main.bicep -p image=REGISTRY/timeline:TAG

targetScope = 'resourceGroup'

@description('Where everything goes.')
param location string = resourceGroup().location

@description('A short prefix for every resource name (lower-case letters and digits).')
@minLength(3)
@maxLength(11)
param prefix string = 'timeline'

@description('The container image, e.g. myregistry.azurecr.io/timeline:1.0.')
param image string

@description('The image registry the identity pulls from (empty: a public image).')
param registryServer string = ''

@description('Storage redundancy: Standard_ZRS keeps data through a zone outage.')
@allowed(['Standard_ZRS', 'Standard_GRS', 'Standard_GZRS', 'Standard_RAGZRS'])
param storageSku string = 'Standard_ZRS'

@description('The virtual network\'s address space.')
param addressPrefix string = '10.40.0.0/22'

@description('The Container Apps environment\'s subnet (a /27 at least; a /23 leaves room).')
param appsSubnetPrefix string = '10.40.0.0/23'

@description('The storage account\'s private endpoints\' subnet.')
param endpointsSubnetPrefix string = '10.40.2.0/27'

@description('Most worker replicas the queue-depth rule scales out to.')
@minValue(1)
@maxValue(30)
param maxWorkers int = 10

@description('Messages waiting on fanout-0 per worker replica before another is added.')
param messagesPerWorker int = 200

@description('API replicas (the API is stateless; each answers /readyz only once storage is).')
@minValue(1)
param minApiReplicas int = 2

var suffix = uniqueString(resourceGroup().id, prefix)
// Built-in role definitions (the same ids in every tenant).
var tableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
var queueDataContributor = '974c5e8b-45b9-4653-ba55-5f855dd0fb88'

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${prefix}-id-${suffix}'
  location: location
}

resource network 'Microsoft.Network/virtualNetworks@2024-01-01' = {
  name: '${prefix}-net-${suffix}'
  location: location
  properties: {
    addressSpace: { addressPrefixes: [addressPrefix] }
    subnets: [
      {
        name: 'apps' // the Container Apps environment's infrastructure (workload profiles)
        properties: {
          addressPrefix: appsSubnetPrefix
          delegations: [
            { name: 'apps', properties: { serviceName: 'Microsoft.App/environments' } }
          ]
        }
      }
      {
        name: 'endpoints' // the storage account's private endpoints
        properties: { addressPrefix: endpointsSubnetPrefix }
      }
    ]
  }
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_43: take(prefix + uniqueString(), 24) is 3-24 lower-case letters and digits
  // checkov:skip=CKV_AZURE_206: storageSku allows only zone- or geo-redundant SKUs
  name: take('${prefix}${suffix}', 24)
  location: location
  sku: { name: storageSku }
  kind: 'StorageV2'
  properties: {
    allowSharedKeyAccess: false // Entra ID only: the apps sign in with the identity
    defaultToOAuthAuthentication: true
    allowBlobPublicAccess: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: 'Disabled' // reached through its private endpoints only
    networkAcls: {
      bypass: 'AzureServices' // Azure's own services (diagnostics, backup), never the internet
      defaultAction: 'Deny'
    }
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: true
      services: {
        table: { enabled: true, keyType: 'Account' }
        queue: { enabled: true, keyType: 'Account' }
      }
    }
  }
}

// A private endpoint and a private DNS zone for each service the apps use.
resource privateZones 'Microsoft.Network/privateDnsZones@2024-06-01' = [for service in ['table', 'queue']: {
  name: 'privatelink.${service}.${environment().suffixes.storage}'
  location: 'global'
}]

resource zoneLinks 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2024-06-01' = [for (service, i) in ['table', 'queue']: {
  parent: privateZones[i]
  name: '${service}-link'
  location: 'global'
  properties: {
    registrationEnabled: false
    virtualNetwork: { id: network.id }
  }
}]

resource endpoints 'Microsoft.Network/privateEndpoints@2024-01-01' = [for (service, i) in ['table', 'queue']: {
  name: '${prefix}-${service}-pe-${suffix}'
  location: location
  properties: {
    subnet: { id: network.properties.subnets[1].id }
    privateLinkServiceConnections: [
      {
        name: service
        properties: { privateLinkServiceId: storage.id, groupIds: [service] }
      }
    ]
  }
}]

resource endpointZones 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-01-01' = [for (service, i) in ['table', 'queue']: {
  parent: endpoints[i]
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      { name: service, properties: { privateDnsZoneId: privateZones[i].id } }
    ]
  }
}]

resource tableRole 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: storage
  name: guid(storage.id, identity.id, tableDataContributor)
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', tableDataContributor)
  }
}

resource queueRole 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: storage
  name: guid(storage.id, identity.id, queueDataContributor)
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', queueDataContributor)
  }
}

resource logs 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: '${prefix}-logs-${suffix}'
  location: location
  properties: {
    sku: { name: 'PerGB2018' }
    retentionInDays: 30
  }
}

resource appsEnv 'Microsoft.App/managedEnvironments@2024-03-01' = {
  name: '${prefix}-env-${suffix}'
  location: location
  properties: {
    vnetConfiguration: {
      infrastructureSubnetId: network.properties.subnets[0].id
      internal: false // the API's ingress stays public; storage does not
    }
    workloadProfiles: [{ name: 'Consumption', workloadProfileType: 'Consumption' }]
    appLogsConfiguration: {
      destination: 'log-analytics'
      logAnalyticsConfiguration: {
        customerId: logs.properties.customerId
        sharedKey: logs.listKeys().primarySharedKey
      }
    }
  }
}

// What every program of the image is given: where storage is, and which identity to use.
var storageEnv = [
  { name: 'TIMELINE_STORAGE_TABLE_URLS', value: storage.properties.primaryEndpoints.table }
  { name: 'TIMELINE_STORAGE_QUEUE_URLS', value: storage.properties.primaryEndpoints.queue }
  { name: 'AZURE_CLIENT_ID', value: identity.properties.clientId }
  { name: 'TIMELINE_LOG_FORMAT', value: 'json' }
]
var registries = empty(registryServer) ? [] : [
  { server: registryServer, identity: identity.id }
]
var userIdentity = {
  type: 'UserAssigned'
  userAssignedIdentities: { '${identity.id}': {} }
}

resource api 'Microsoft.App/containerApps@2025-01-01' = {
  name: '${prefix}-api'
  location: location
  identity: userIdentity
  dependsOn: [tableRole, queueRole]
  properties: {
    environmentId: appsEnv.id
    configuration: {
      registries: registries
      ingress: {
        external: true
        targetPort: 8080
        transport: 'http'
        allowInsecure: false
      }
    }
    template: {
      containers: [
        {
          name: 'api'
          image: image
          command: ['timeline-api']
          env: storageEnv
          resources: { cpu: json('1.0'), memory: '2Gi' }
          probes: [
            {
              type: 'Liveness'
              httpGet: { path: '/healthz', port: 8080 }
              periodSeconds: 15
            }
            {
              type: 'Readiness'
              httpGet: { path: '/readyz', port: 8080 }
              periodSeconds: 5
              failureThreshold: 3
            }
          ]
        }
      ]
      scale: {
        minReplicas: minApiReplicas
        maxReplicas: 10
        rules: [
          {
            name: 'http'
            http: { metadata: { concurrentRequests: '200' } }
          }
        ]
      }
    }
  }
}

resource worker 'Microsoft.App/containerApps@2025-01-01' = {
  name: '${prefix}-worker'
  location: location
  identity: userIdentity
  dependsOn: [tableRole, queueRole]
  properties: {
    environmentId: appsEnv.id
    configuration: {
      registries: registries
    }
    template: {
      containers: [
        {
          name: 'worker'
          image: image
          command: ['fanout-worker']
          env: storageEnv
          resources: { cpu: json('1.0'), memory: '2Gi' }
          probes: [
            {
              type: 'Liveness'
              httpGet: { path: '/metrics', port: 9102 }
              periodSeconds: 15
            }
          ]
        }
      ]
      scale: {
        minReplicas: 1 // a worker also runs the expiry sweep and the delayed second passes
        maxReplicas: maxWorkers
        rules: [
          {
            // One rule per queue shard: one account has one shard, fanout-0.
            name: 'fanout-depth'
            azureQueue: {
              accountName: storage.name
              queueName: 'fanout-0'
              queueLength: messagesPerWorker
              identity: identity.id
            }
          }
        ]
      }
    }
  }
}

resource init 'Microsoft.App/jobs@2024-03-01' = {
  name: '${prefix}-init'
  location: location
  identity: userIdentity
  dependsOn: [tableRole, queueRole]
  properties: {
    environmentId: appsEnv.id
    configuration: {
      triggerType: 'Manual'
      replicaTimeout: 600
      replicaRetryLimit: 2
      manualTriggerConfig: { parallelism: 1, replicaCompletionCount: 1 }
      registries: registries
    }
    template: {
      containers: [
        {
          name: 'init'
          image: image
          command: ['timeline', 'init']
          env: storageEnv
          resources: { cpu: json('0.5'), memory: '1Gi' }
        }
      ]
    }
  }
}

output apiUrl string = 'https://${api.properties.configuration.ingress.fqdn}'
output storageAccount string = storage.name
output identityClientId string = identity.properties.clientId
